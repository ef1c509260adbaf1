//! Completion: a worker's result becomes the execution's terminal state. Workers record their
//! successes themselves (see `attune_worker`); what arrives here are failures and timeouts, for the
//! RetryManager, and whatever a worker could not record.

use attune_common::db;
use attune_common::mq::{Disposition, ExecutionResult, Incoming, ResultStatus};
use attune_core::{ExecutionStatus, FailureKind};

use crate::Context;

pub async fn handle(context: &Context, incoming: Incoming) -> Disposition {
    let result: ExecutionResult = match incoming.parse("execution result") {
        Ok(result) => result,
        Err(disposition) => return disposition,
    };
    match db::retry_while_unavailable("recording a result", || record(context, &result)).await {
        Ok(()) => Disposition::Ack,
        Err(e) => {
            tracing::warn!(execution_id = result.execution_id, error = %e, "recording the result failed, will be redelivered");
            Disposition::Retry
        }
    }
}

pub async fn record(context: &Context, result: &ExecutionResult) -> Result<(), crate::Error> {
    let outcome = result.outcome();
    result.observe_duration();
    // the status and failure kind recorded, if the result was not stale
    let recorded: Option<(ExecutionStatus, Option<FailureKind>)> = match result.status {
        ResultStatus::Completed => {
            db::execution::complete(&context.db, result.execution_id, result.worker_id, &outcome)
                .await?
                .map(|changed| (changed.status, None))
        }
        ResultStatus::Failed | ResultStatus::Timeout => {
            let reported = result.status.recorded();
            match db::execution::get(&context.db, result.execution_id).await? {
                Some(current) => context
                    .retry_manager
                    .record_failure(&current, reported, &[ExecutionStatus::Running], Some(result.worker_id), &outcome)
                    .await?
                    .map(|recorded| (recorded.execution.status, recorded.execution.failure_kind)),
                None => None,
            }
        }
    };
    match recorded {
        Some((status, failure_kind)) => {
            // one finished execution frees a slot: the scheduler looks again
            context.waiting.wake();
            tracing::info!(
                execution_id = result.execution_id,
                worker_id = result.worker_id,
                status = %status,
                failure_kind = failure_kind.map(FailureKind::as_str).unwrap_or(""),
                duration_ms = result.duration_ms,
                "execution finished"
            )
        }
        None => tracing::debug!(execution_id = result.execution_id, "result is stale or a duplicate"),
    }
    Ok(())
}
