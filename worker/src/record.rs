//! Recording a run's outcome: a success written by the worker (in batches), a failure reported to
//! the executors through the broker, and the report kept in the row meanwhile.

use std::time::Duration;

use attune_common::db;
use attune_common::mq::{ExecutionResult, RESULT_KEY, ResultStatus};
use attune_core::FailureKind;

use crate::{REPORT_WRITE_LIMIT, Worker};

pub(crate) fn failure_result(
    execution_id: i64,
    worker_id: i64,
    run_token: Option<String>,
    kind: FailureKind,
    error: String,
) -> ExecutionResult {
    ExecutionResult {
        execution_id,
        worker_id,
        run_token,
        status: ResultStatus::Failed,
        result: None,
        failure_kind: Some(kind),
        error: Some(error),
        exit_code: None,
        stdout: String::new(),
        stderr: String::new(),
        duration_ms: 0,
        http_status: None,
        retry_after_ms: None,
        trace: None,
    }
}

/// A run token (see `ExecutionResult::run_token`): 128 bits from the thread's generator (ChaCha,
/// seeded from the operating system), as 32 hex digits.
pub(crate) fn new_run_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The exit codes an action's stored `retry` block treats as transient (besides 75).
pub(crate) fn transient_exit_codes(retry_policy: Option<&serde_json::Value>) -> Vec<i32> {
    retry_policy
        .and_then(|policy| serde_json::from_value::<attune_common::pack::RetryPolicy>(policy.clone()).ok())
        .and_then(|policy| policy.exit_codes)
        .unwrap_or_default()
}

impl Worker {
    /// Records a success here, with the guarded transition an executor would use (running →
    /// completed, fenced by this worker): one message, one delivery and one executor round trip
    /// fewer per execution. Failures go to the executors as results, for the RetryManager.
    /// `false` (after logging) if the database refused the write, or did not take it within a
    /// quarter of the lease (cut off): the result then goes to the executors as well.
    pub(crate) async fn record_success(&self, result: &ExecutionResult) -> bool {
        let write = self.writes.record_success(result.execution_id, result.outcome(), result.run_token.clone());
        // A success that cannot be written soon (the database cut off) goes to the executors
        // too: they record it, before anyone may take this worker for dead and run the execution
        // again. Whichever write lands first records it; the other misses (the same guard).
        let patience = self.settings.lease() / 4;
        let Ok(recorded) = tokio::time::timeout(patience, write).await else {
            tracing::warn!(
                execution_id = result.execution_id,
                waited_ms = patience.as_millis() as u64,
                "the success could not be written yet; reporting it to the executors"
            );
            return false;
        };
        match recorded {
            Ok(true) => {
                result.observe_duration();
                tracing::info!(
                    execution_id = result.execution_id,
                    worker_id = self.id,
                    duration_ms = result.duration_ms,
                    "execution completed"
                );
                true
            }
            Ok(false) => {
                tracing::debug!(
                    execution_id = result.execution_id,
                    "execution no longer running here (canceled or taken over)"
                );
                true
            }
            Err(e) => {
                tracing::warn!(execution_id = result.execution_id, error = %e, "could not record the success; reporting it to the executors");
                false
            }
        }
    }

    /// Keeps the report of a run in its row as well (`db::report`), so that the executors record
    /// it even if the broker delays the message (one try, bounded: the message still goes).
    pub(crate) async fn keep_report(&self, result: &ExecutionResult) {
        let Ok(report) = serde_json::to_value(result) else { return };
        let keep = db::report::keep(&self.db, result.execution_id, self.id, result.run_token.as_deref(), &report);
        match tokio::time::timeout(REPORT_WRITE_LIMIT, keep).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(execution_id = result.execution_id, error = %e, "could not keep the report in the row")
            }
            Err(_) => {
                tracing::debug!(execution_id = result.execution_id, "keeping the report in the row took too long")
            }
        }
    }

    /// Reports run `execution_id` (claimed with `run_token`) failed as `kind`, nothing run or
    /// kept of it, under `trace` (its span's context, when traces are on).
    pub(crate) async fn report_failure(
        &self,
        execution_id: i64,
        run_token: String,
        trace: Option<String>,
        kind: FailureKind,
        error: String,
    ) {
        let result = ExecutionResult { trace, ..failure_result(execution_id, self.id, Some(run_token), kind, error) };
        self.report(&result).await;
    }

    /// Publishes a result, retrying until the broker confirms it: the execution is `running` in
    /// the database and only this message can finish it.
    pub(crate) async fn report(&self, result: &ExecutionResult) {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.publisher.publish(RESULT_KEY, result).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(execution_id = result.execution_id, error = %e, "could not report result, retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn run_tokens_are_128_random_bits_in_hex() {
        let (a, b) = (new_run_token(), new_run_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn transient_exit_codes_come_from_the_stored_retry_block() {
        assert_eq!(transient_exit_codes(Some(&json!({"exit_codes": [3, 4]}))), [3, 4]);
        assert!(transient_exit_codes(Some(&json!({"max_attempts": 2}))).is_empty());
        assert!(transient_exit_codes(None).is_empty());
    }
}
