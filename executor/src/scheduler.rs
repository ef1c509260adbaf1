//! Scheduling: requested → scheduling → scheduled, and the dispatch to the chosen worker.

use std::sync::Arc;

use attune_common::db::{self, action::Action, execution::Execution, execution::Outcome, execution::Transition};
use attune_common::metrics;
use attune_common::mq::{Dispatch, Disposition, ExecutionRequest, Incoming, Topology};
use attune_common::pack::RetryPolicy;
use attune_common::{ExecutionStatus, FailureKind};

use crate::Context;

pub async fn handle(context: &Context, incoming: Incoming) -> Disposition {
    let request: ExecutionRequest = match incoming.parse("execution request") {
        Ok(request) => request,
        Err(disposition) => return disposition,
    };
    let execution_id = request.execution_id;
    match db::retry_while_unavailable("scheduling", || schedule(context, execution_id)).await {
        Ok(()) => Disposition::Ack,
        Err(e) => {
            tracing::warn!(execution_id = request.execution_id, error = %e, "scheduling failed, will be redelivered");
            Disposition::Retry
        }
    }
}

async fn schedule(context: &Context, execution_id: i64) -> Result<(), crate::Error> {
    let db = &context.db;
    let claim =
        Transition::to(ExecutionStatus::Scheduling).from(&[ExecutionStatus::Requested, ExecutionStatus::Scheduling]);
    let Some(execution) = db::execution::transition(db, execution_id, &claim).await? else {
        tracing::debug!(execution_id, "request is stale or a duplicate");
        return Ok(());
    };
    let action = match execution.action {
        Some(action_id) => action(context, action_id).await?,
        None => None,
    };
    let Some(action) = action else {
        let reason = format!("action '{}' no longer exists", execution.action_ref);
        return fail(context, &execution, ExecutionStatus::Scheduling, FailureKind::ActionNotFound, reason).await;
    };
    let Some((chosen, reservation)) = wait_for_worker(context, &action.runtime).await? else {
        metrics::increment(&metrics::WORKER_UNAVAILABLE, &[("runtime", &action.runtime)], 1);
        let reason = format!(
            "no healthy or degraded active worker offered runtime '{}' within {:?}",
            action.runtime, context.settings.worker_wait
        );
        return fail(context, &execution, ExecutionStatus::Scheduling, FailureKind::WorkerUnavailable, reason).await;
    };
    let assign =
        Transition::to(ExecutionStatus::Scheduled).from(&[ExecutionStatus::Scheduling]).assign_worker(chosen.worker_id);
    let assigned = db::execution::transition(db, execution_id, &assign).await;
    // committed (or not): the database counts it from here on
    drop(reservation);
    let Some(execution) = assigned? else {
        return Ok(());
    };
    let transient_exit_codes = action
        .retry_policy
        .as_ref()
        .and_then(|p| serde_json::from_value::<RetryPolicy>(p.clone()).ok())
        .and_then(|p| p.exit_codes)
        .unwrap_or_default();
    let dispatch = Dispatch {
        execution_id,
        worker_id: chosen.worker_id,
        action_ref: action.action_ref.clone(),
        runtime: action.runtime.clone(),
        entrypoint: action.entrypoint.clone(),
        pack_path: action.pack_path.clone().unwrap_or_default(),
        parameters: execution.parameters.clone(),
        timeout_seconds: execution.timeout_seconds.unwrap_or(context.settings.common.default_timeout_secs),
        retry_count: execution.retry_count,
        transient_exit_codes,
    };
    if let Err(e) = context.publisher.publish(&Topology::worker_key(chosen.worker_id), &dispatch).await {
        tracing::warn!(execution_id, worker_id = chosen.worker_id, error = %e, "dispatch failed");
        let reason = format!("could not dispatch to worker {}: {e}", chosen.worker_id);
        return fail(context, &execution, ExecutionStatus::Scheduled, FailureKind::WorkerUnavailable, reason).await;
    }
    let requested_at = execution.not_before.unwrap_or(execution.created);
    let latency = (chrono::Utc::now() - requested_at).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6;
    metrics::observe(&metrics::DISPATCH_LATENCY, &[], latency);
    tracing::debug!(
        execution_id,
        worker_id = chosen.worker_id,
        class = chosen.class.as_str(),
        queue_depth = chosen.queue_depth,
        "dispatched"
    );
    Ok(())
}

/// Backpressure: while every worker for the runtime is busy (unhealthy by queue depth) or none is
/// there yet, the request waits here, unacknowledged (so a crash loses nothing), for up to
/// `worker_wait`, woken whenever an execution finishes. The requests behind it stay in the queue.
/// Only then is it the retriable failure `worker_unavailable`.
async fn wait_for_worker(
    context: &Context,
    runtime: &str,
) -> Result<Option<(attune_common::selection::Ranked, crate::health_probe::Reservation)>, crate::Error> {
    let deadline = tokio::time::Instant::now() + context.settings.worker_wait;
    loop {
        // registered before the check, so a completion between the two is not missed
        let capacity = context.capacity.notified();
        tokio::pin!(capacity);
        capacity.as_mut().enable();
        if let Some(chosen) = context.health_probe.select_worker(runtime).await? {
            return Ok(Some(chosen));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::select! {
            _ = capacity => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// The action, from a short-lived cache (one read fewer per execution under steady traffic); a
/// pack update reaches scheduling within `action_cache_ttl`.
async fn action(context: &Context, action_id: i64) -> Result<Option<Arc<Action>>, crate::Error> {
    let now = std::time::Instant::now();
    if let Some((read_at, action)) = context.actions.lock().expect("action cache poisoned").get(&action_id)
        && now.duration_since(*read_at) < context.settings.action_cache_ttl
    {
        return Ok(Some(action.clone()));
    }
    let Some(action) = db::action::get(&context.db, action_id).await? else { return Ok(None) };
    let action = Arc::new(action);
    let mut cache = context.actions.lock().expect("action cache poisoned");
    if cache.len() > 10_000 {
        cache.clear();
    }
    cache.insert(action_id, (now, action.clone()));
    Ok(Some(action))
}

/// Fails an execution the executor could not get to a worker, through the RetryManager (so a
/// retriable failure such as `worker_unavailable` is retried with backoff).
async fn fail(
    context: &Context,
    execution: &Execution,
    from: ExecutionStatus,
    kind: FailureKind,
    reason: String,
) -> Result<(), crate::Error> {
    tracing::warn!(execution_id = execution.id, failure_kind = %kind, %reason, "execution cannot be scheduled");
    let outcome = Outcome { failure_kind: Some(kind.to_string()), error: Some(reason), ..Default::default() };
    context.retry_manager.record_failure(execution, ExecutionStatus::Failed, &[from], None, &outcome).await?;
    Ok(())
}
