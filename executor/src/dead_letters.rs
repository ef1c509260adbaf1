//! The DLQ handler: what to do with each dead letter, by where it came from and why.
//!
//! A dispatch message names one or more executions (`Dispatch::more`); each is handled as below,
//! except that an execution of several that had started is left to its worker (below).
//!
//! - A dispatch that **expired** in a worker queue (the worker did not take it within the queue's
//!   TTL) fails its execution as `queue_timeout` — only if it is still `scheduled` on that worker
//!   — and the RetryManager decides about a retry. The worker is marked inactive only if its
//!   heartbeat is stale too; otherwise it is marked as not consuming (expired work is evidence
//!   that nothing takes from its queue), which keeps new work away from it until its next
//!   heartbeat says whether its consumer is up.
//! - A dispatch dead-lettered after its **delivery limit** whose execution had not started
//!   (a worker held it through reconnects) is handed back to waiting; one that was running fails
//!   as `poison_message`, with the reason (not retried), when the message named it alone. When
//!   it named several, the message came back for those still waiting for a run slot, and one
//!   that runs goes on. A request hint dead-lettered so is dropped: the waiting row is the
//!   request, and the schedulers sweep it.
//! - A result dead-lettered after its delivery limit is parked and its execution failed as
//!   `poison_message`.
//! - Anything else (an unparseable message, say) is logged with
//!   its content and moved to the parked queue for an operator. Nothing is requeued forever and
//!   nothing is silently dropped.

use attune_common::db::{self, execution::Outcome};
use attune_common::metrics;
use attune_common::mq::{DELIVERY_LIMIT, Disposition};
use attune_common::mq::{
    Death, Dispatch, ExecutionRequest, ExecutionResult, Incoming, PARKED_KEY, REQUEST_KEY, RESULT_KEY, Topology, death,
};
use attune_core::{ExecutionStatus, FailureKind};

use crate::Context;

pub async fn handle(context: &Context, incoming: Incoming) -> Disposition {
    let why = death(&incoming.headers).unwrap_or(Death { reason: "unknown".into(), queue: String::new() });
    metrics::increment(&metrics::DEAD_LETTERS, &[("reason", &why.reason)], 1);
    let outcome = db::retry_while_unavailable("handling a dead letter", || act(context, &incoming, &why)).await;
    match outcome {
        Ok(()) => Disposition::Ack,
        // Not a passing outage (those are waited out above): keep the message for an operator
        // rather than loop on it.
        Err(e) => {
            tracing::error!(error = %e, routing_key = %incoming.routing_key, "dead letter could not be handled");
            match db::retry_while_unavailable("parking a dead letter", || park(context, &incoming, &why)).await {
                Ok(()) => Disposition::Ack,
                Err(_) => Disposition::Retry,
            }
        }
    }
}

async fn act(context: &Context, incoming: &Incoming, why: &Death) -> Result<(), crate::Error> {
    let key = incoming.routing_key.as_str();
    if let Some(worker_id) = Topology::worker_of_key(key)
        && let Ok(dispatch) = serde_json::from_slice::<Dispatch>(&incoming.data)
    {
        let executions = dispatch.executions();
        if why.reason == "expired" {
            return expired_dispatch(context, &executions, worker_id).await;
        }
        let mut handed_back = false;
        for &execution_id in &executions {
            // returned to the queue on every reconnect while the worker held it: never started,
            // so it waits again
            match db::execution::hand_back(&context.db, execution_id, worker_id).await? {
                Some(_) => {
                    tracing::warn!(execution_id, worker_id, reason = %why.reason, "dead-lettered dispatch had not started; the execution waits again");
                    metrics::increment(&metrics::HANDED_BACK, &[("by", "executor")], 1);
                    handed_back = true;
                }
                // A message of its own that kept coming back while its execution ran is poison
                // (fenced by the worker: one running elsewhere since is not this message's). One
                // execution of several is not: the message came back for a sibling still waiting
                // for a slot, and a running execution goes on on its worker (or, if that worker
                // dies, ends through the monitor).
                None if executions.len() == 1 => {
                    poison(context, execution_id, Some(worker_id), why, &[ExecutionStatus::Running]).await?
                }
                None => {
                    tracing::debug!(execution_id, worker_id, reason = %why.reason, "dead-lettered dispatch had started; left to its worker")
                }
            }
        }
        if handed_back {
            context.waiting.mark_all();
        }
        return Ok(());
    }
    if key == REQUEST_KEY
        && why.reason != "rejected"
        && let Ok(request) = serde_json::from_slice::<ExecutionRequest>(&incoming.data)
    {
        // a request message is only a hint: the waiting row is the request, and the schedulers'
        // sweep finds it
        tracing::warn!(execution_id = request.execution_id, reason = %why.reason, "dead-lettered request hint dropped");
        context.waiting.mark_all();
        return Ok(());
    }
    if key == RESULT_KEY
        && why.reason == "delivery_limit"
        && let Ok(result) = serde_json::from_slice::<ExecutionResult>(&incoming.data)
    {
        // the outcome could not be recorded: keep the message for an operator, and end the execution
        park(context, incoming, why).await?;
        return poison(context, result.execution_id, None, why, &[ExecutionStatus::Running]).await;
    }
    park(context, incoming, why).await
}

/// The executions of an expired dispatch message that are still `scheduled` on its worker fail as
/// `queue_timeout`; the worker is marked once for the message.
async fn expired_dispatch(context: &Context, executions: &[i64], worker_id: i64) -> Result<(), crate::Error> {
    let mut expired = Vec::with_capacity(executions.len());
    for &execution_id in executions {
        let Some(current) = db::execution::get(&context.db, execution_id).await? else { continue };
        if current.status != ExecutionStatus::Scheduled || current.worker != Some(worker_id) {
            tracing::debug!(execution_id, worker_id, status = %current.status, "expired dispatch is stale");
            continue;
        }
        expired.push(current);
    }
    if expired.is_empty() {
        return Ok(());
    }
    let max_age = std::time::Duration::from_secs(context.settings.health.heartbeat_max_age_secs.max(0) as u64);
    db::worker::deactivate_silent(&context.db, Some(worker_id), max_age).await?;
    db::worker::mark_not_consuming(&context.db, worker_id).await?;
    let outcome = Outcome {
        failure_kind: Some(FailureKind::QueueTimeout),
        error: Some(format!("not taken by worker {worker_id} within its queue TTL")),
        ..Default::default()
    };
    for current in &expired {
        tracing::warn!(execution_id = current.id, worker_id, "dispatch expired in the worker queue");
        context
            .retry_manager
            .record_failure(current, ExecutionStatus::Failed, &[ExecutionStatus::Scheduled], Some(worker_id), &outcome)
            .await?;
    }
    Ok(())
}

async fn poison(
    context: &Context,
    execution_id: i64,
    worker_id: Option<i64>,
    why: &Death,
    from: &[ExecutionStatus],
) -> Result<(), crate::Error> {
    let Some(current) = db::execution::get(&context.db, execution_id).await? else { return Ok(()) };
    let outcome = Outcome {
        failure_kind: Some(FailureKind::PoisonMessage),
        error: Some(format!(
            "its message from '{}' was dead-lettered ({}) after failing processing on up to {DELIVERY_LIMIT} deliveries",
            why.queue, why.reason
        )),
        ..Default::default()
    };
    tracing::error!(execution_id, queue = %why.queue, reason = %why.reason, "poison message: failing its execution");
    metrics::increment(&metrics::POISON_MESSAGES, &[], 1);
    let _span = attune_common::trace::failure_span(current.id, current.trace_parent.as_deref(), outcome.failure_kind);
    context.retry_manager.record_failure(&current, ExecutionStatus::Failed, from, worker_id, &outcome).await?;
    Ok(())
}

async fn park(context: &Context, incoming: &Incoming, why: &Death) -> Result<(), crate::Error> {
    tracing::error!(
        routing_key = %incoming.routing_key,
        queue = %why.queue,
        reason = %why.reason,
        body = %String::from_utf8_lossy(&incoming.data),
        "dead letter parked for an operator"
    );
    let exchange = context.publisher.topology().exchange();
    context.publisher.publish_bytes(&exchange, PARKED_KEY, &incoming.data).await?;
    metrics::increment(&metrics::PARKED_MESSAGES, &[], 1);
    Ok(())
}
