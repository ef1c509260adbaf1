//! Completion: a worker's result becomes the execution's terminal state. Workers record their
//! successes themselves (see `attune_worker`); what arrives here are failures and timeouts, for the
//! RetryManager, and whatever a worker could not record.
//!
//! A result is recorded only for the run it names: `running` on its worker, with the run token
//! that worker drew at its claim (`ExecutionResult::run_token`, in the transition's guard). One
//! that misses is acked and dropped: a duplicate or a stale result quietly; one for an execution
//! still running on its worker, so whose token was wrong or missing (forged, or from an earlier
//! claim), with a warning naming the execution.

use attune_common::db::{self, execution::Transition};
use attune_common::mq::{Disposition, ExecutionResult, Incoming, ResultStatus};
use attune_core::{ExecutionStatus, FailureKind};

use crate::Context;

pub async fn handle(context: &Context, incoming: Incoming) -> Disposition {
    let result: ExecutionResult = match incoming.parse("execution result") {
        Ok(result) => result,
        Err(disposition) => return disposition,
    };
    // under the span of the worker's `record`, when traces are on and the result names one (a
    // result that names none starts no trace of its own)
    let parent = result.trace.as_deref().filter(|_| attune_common::trace::on()).and_then(attune_common::trace::valid);
    let _span = parent.map(|parent| {
        attune_common::trace::span(
            "record result",
            attune_common::trace::Kind::Consumer,
            Some(result.execution_id),
            Some(&parent),
        )
    });
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
    // the status and failure kind recorded, if the result was not stale
    let run_token = result.run_token.as_deref();
    let recorded: Option<(ExecutionStatus, Option<FailureKind>)> = match result.status {
        ResultStatus::Completed => {
            let complete = Transition::completion(result.worker_id, &outcome).run_token(run_token);
            db::execution::transition_brief(&context.db, result.execution_id, &complete)
                .await?
                .map(|changed| (changed.status, None))
        }
        ResultStatus::Failed | ResultStatus::Timeout => {
            let reported = result.status.recorded();
            match db::execution::get(&context.db, result.execution_id).await? {
                Some(current) => context
                    .retry_manager
                    .record_reported_failure(&current, reported, result.worker_id, run_token, &outcome)
                    .await?
                    .map(|recorded| (recorded.execution.status, recorded.execution.failure_kind)),
                None => None,
            }
        }
    };
    match recorded {
        Some((status, failure_kind)) => {
            result.observe_duration();
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
        None => {
            // the guard's other conditions hold: only the token can have missed (read after the
            // miss, which is rare, not before every result)
            let current = db::execution::get(&context.db, result.execution_id).await?;
            let forged = current.is_some_and(|current| {
                current.status == ExecutionStatus::Running && current.worker == Some(result.worker_id)
            });
            if forged {
                tracing::warn!(
                    execution_id = result.execution_id,
                    worker_id = result.worker_id,
                    run_token = if run_token.is_some() { "wrong" } else { "missing" },
                    "result dropped: its run token is not the execution's"
                );
            } else {
                tracing::debug!(execution_id = result.execution_id, "result is stale or a duplicate");
                // a run ended by hand has ended on its worker too: its concurrency slot is free
                db::execution::monitor::release_stale(&context.db, result.execution_id, result.worker_id, run_token)
                    .await?;
            }
        }
    }
    Ok(())
}
