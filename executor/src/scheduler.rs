//! Scheduling: requested → scheduled (through scheduling when it must wait for a worker with
//! capacity), and the dispatch to the chosen worker.

use attune_common::db::{self, execution::Execution, execution::Outcome, execution::Transition};
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
    match db::retry_while_unavailable("scheduling", || schedule(context, &request)).await {
        Ok(()) => Disposition::Ack,
        Err(e) => {
            tracing::warn!(execution_id = request.execution_id, error = %e, "scheduling failed, will be redelivered");
            Disposition::Retry
        }
    }
}

/// requested → scheduled in one guarded write, as soon as a worker has capacity: at once in the
/// common case, otherwise after waiting for capacity with the request unacknowledged (a wait
/// writes nothing unless it is long, so a backlog costs no commits). The claim (requested → scheduling) is
/// written only when the execution is about to fail here, and for a request without its action
/// (from an earlier version), to read the action from the row.
async fn schedule(context: &Context, request: &ExecutionRequest) -> Result<(), crate::Error> {
    let db = &context.db;
    let execution_id = request.execution_id;
    let mut claimed = None;
    let action_id = match request.action_id {
        Some(action_id) => Some(action_id),
        None => {
            let Some(execution) = claim(context, execution_id).await? else { return Ok(()) };
            let action_id = execution.action;
            claimed = Some(execution);
            action_id
        }
    };
    let action = match action_id {
        Some(action_id) => context.actions.get(db, action_id).await?,
        None => None,
    };
    let Some(action) = action else {
        let Some(execution) = held(context, execution_id, claimed).await? else { return Ok(()) };
        let reason = format!("action '{}' no longer exists", execution.action_ref);
        return fail(context, &execution, ExecutionStatus::Scheduling, FailureKind::ActionNotFound, reason).await;
    };
    let chosen = match context.health_probe.select_worker(&action.runtime).await? {
        Some(chosen) => chosen,
        // every worker is busy: wait for capacity, holding the request (not the row)
        None => match wait_for_worker(context, execution_id, &action.runtime).await? {
            Some(chosen) => chosen,
            None => {
                let Some(execution) = held(context, execution_id, claimed).await? else { return Ok(()) };
                metrics::increment(&metrics::WORKER_UNAVAILABLE, &[("runtime", &action.runtime)], 1);
                let reason = format!(
                    "no healthy or degraded active worker offered runtime '{}' within {:?}",
                    action.runtime, context.settings.worker_wait
                );
                let kind = FailureKind::WorkerUnavailable;
                return fail(context, &execution, ExecutionStatus::Scheduling, kind, reason).await;
            }
        },
    };
    let (chosen, reservation) = chosen;
    let from: &[ExecutionStatus] = match claimed {
        Some(_) => &[ExecutionStatus::Scheduling],
        // a request redelivered after an executor died may find that executor's claim
        None => &[ExecutionStatus::Requested, ExecutionStatus::Scheduling],
    };
    let assign = Transition::to(ExecutionStatus::Scheduled).from(from).assign_worker(chosen.worker_id);
    let assigned = db::execution::transition(db, execution_id, &assign).await;
    // committed (or not): the database counts it from here on
    drop(reservation);
    let Some(execution) = assigned? else {
        tracing::debug!(execution_id, "request is stale or a duplicate");
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

/// requested → scheduling: this executor holds the execution. `None`: the request is stale or a
/// duplicate.
async fn claim(context: &Context, execution_id: i64) -> Result<Option<Execution>, crate::Error> {
    let claim =
        Transition::to(ExecutionStatus::Scheduling).from(&[ExecutionStatus::Requested, ExecutionStatus::Scheduling]);
    let claimed = db::execution::transition(&context.db, execution_id, &claim).await?;
    if claimed.is_none() {
        tracing::debug!(execution_id, "request is stale or a duplicate");
    }
    Ok(claimed)
}

/// The claimed execution: `claimed` if it is already, else claimed now.
async fn held(
    context: &Context,
    execution_id: i64,
    claimed: Option<Execution>,
) -> Result<Option<Execution>, crate::Error> {
    match claimed {
        Some(execution) => Ok(Some(execution)),
        None => claim(context, execution_id).await,
    }
}

/// How often a request waiting for capacity looks again. Workers record successes themselves, so
/// only failures recorded by this executor can wake it sooner. A look costs no database read
/// while the health probe's reads are fresh (`ATTUNE_INFLIGHT_CACHE_MS`, `ATTUNE_WORKER_CACHE_MS`).
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Backpressure: while every worker for the runtime is busy (unhealthy by queue depth) or none is
/// there yet, the request waits here, unacknowledged (so a crash loses nothing: the broker
/// delivers it again), for up to `worker_wait`, looking again every `WAIT_POLL` and whenever this
/// executor records a finished execution. The execution stays `requested` meanwhile, and the
/// requests behind it stay in the queue. Only then is it the retriable failure
/// `worker_unavailable`. A wait longer than a third of `requeue_after` marks the row as held
/// every such third, so the monitor does not re-publish a request that is only waiting.
async fn wait_for_worker(
    context: &Context,
    execution_id: i64,
    runtime: &str,
) -> Result<Option<(attune_common::selection::Ranked, crate::health_probe::Reservation)>, crate::Error> {
    let started = tokio::time::Instant::now();
    let deadline = started + context.settings.worker_wait;
    let keep_every = (context.settings.requeue_after / 3).max(WAIT_POLL);
    let mut next_keep = started + keep_every;
    loop {
        if tokio::time::Instant::now() >= next_keep {
            db::execution::keep_requested(&context.db, execution_id).await?;
            next_keep += keep_every;
        }
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
            _ = tokio::time::sleep(WAIT_POLL) => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
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
