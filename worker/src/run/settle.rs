//! Settling a run: what its outcome becomes. A success is written here (running → completed,
//! fenced by this worker and the run token); a failure is reported to the executors, whose
//! RetryManager decides on the retry, and kept in the row meanwhile; a run stopped because the
//! lease ran out is reported as `worker_heartbeat_stale`; a run stopped by hand (canceled or
//! failed by an operator) keeps what it printed, the record saying so already.

use attune_common::db;
use attune_common::mq::{Disposition, ExecutionResult, ResultStatus};
use attune_core::FailureKind;
use sqlx::PgPool;
use tokio::sync::SemaphorePermit;

use super::prepare::Prepared;
use crate::runner::Ran;
use crate::{REPORT_WRITE_LIMIT, Worker, run_time_moved};

/// How a run's end is settled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Settlement {
    /// Stopped because the worker's lease ran out: reported so, to run elsewhere.
    LeaseLost,
    /// Stopped by hand: its output is kept, and nothing else (the record says so already).
    StoppedByHand,
    Success,
    Failure,
}

/// `lease_lost`: the lease loop stopped it; `canceled`: its token fired; `aborted`: by the
/// drain deadline (the worker stops: its outcome is the run's, reported as any other).
pub(super) fn settlement(lease_lost: bool, canceled: bool, aborted: bool, status: ResultStatus) -> Settlement {
    match () {
        _ if lease_lost => Settlement::LeaseLost,
        _ if canceled && !aborted => Settlement::StoppedByHand,
        _ if status == ResultStatus::Completed => Settlement::Success,
        _ => Settlement::Failure,
    }
}

/// Frees the concurrency slot of a run ended by hand (`db::execution::worker::release`) when dropped, in
/// a task of its own (waiting out a database outage).
struct ReleaseOnDrop {
    db: PgPool,
    execution_id: i64,
    worker_id: i64,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let (db, execution_id, worker_id) = (self.db.clone(), self.execution_id, self.worker_id);
        tokio::spawn(async move { release(&db, Some(execution_id), worker_id).await });
    }
}

/// Says that the processes of a run ended by hand (`None`: of every run of the worker's) are gone,
/// freeing its concurrency slot; waits out a database outage.
pub(crate) async fn release(db: &PgPool, execution_id: Option<i64>, worker_id: i64) {
    let released = db::retry_while_unavailable("releasing a concurrency slot", || {
        db::execution::worker::release(db, execution_id, worker_id)
    })
    .await;
    match released {
        Ok(0) => {}
        Ok(n) => tracing::info!(execution_id, released = n, "concurrency slot freed: the run's processes are gone"),
        Err(e) => tracing::warn!(execution_id, error = %e, "could not free a concurrency slot"),
    }
}

impl Worker {
    /// `slot`: the run slot it held, given back before the outcome is written (the next run may
    /// start meanwhile).
    pub(super) async fn settle(&self, prepared: Prepared<'_>, ran: Ran, slot: SemaphorePermit<'_>) -> Disposition {
        let Prepared { run, run_token, since, span, traceparent, cancel, live, running, .. } = prepared;
        let execution_id = run.id;
        let runtime = run.runtime.as_deref().unwrap_or_default();
        drop(running);
        // its processes are gone: once its outcome is recorded or reported (however this ends),
        // a run ended by hand meanwhile gives its key's slot back, though the worker may never
        // have heard of the cancel (a run not ended by hand has nothing to give back: one
        // statement, for limited actions only)
        let _release =
            run.concurrency_limited.then(|| ReleaseOnDrop { db: self.db.clone(), execution_id, worker_id: self.id });
        if let Some(live) = live {
            self.live.lock().expect("live map poisoned").remove(&execution_id);
            live.ended.cancel();
        }
        drop(slot);
        let lease_lost = self.lease_lost.lock().expect("lease poisoned").remove(&execution_id);
        let settled = settlement(lease_lost, cancel.is_cancelled(), self.abort.is_cancelled(), ran.outcome.status);
        match settled {
            Settlement::LeaseLost => {
                let lease = self.settings.lease().as_secs_f64();
                let error = format!(
                    "the worker's heartbeats did not land for {lease:.1} s (its lease): the run was stopped so that it can run elsewhere"
                );
                let trace = span.traceparent();
                self.report_failure(execution_id, run_token, trace, FailureKind::WorkerHeartbeatStale, error).await;
                return Disposition::Ack;
            }
            Settlement::StoppedByHand => {
                let stopped = match runtime {
                    "http" => "stopped while running (canceled or failed by hand); request aborted",
                    _ => "stopped while running (canceled or failed by hand); process group killed",
                };
                tracing::info!(execution_id, "{stopped}");
                // what it printed until then stays with the record (bounded: the ack goes anyway)
                let keep = db::execution::worker::keep_stopped_output(
                    &self.db,
                    execution_id,
                    self.id,
                    Some(run_token.as_str()),
                    &ran.stdout,
                    &ran.stderr,
                );
                match tokio::time::timeout(REPORT_WRITE_LIMIT, keep).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(execution_id, error = %e, "the stopped run's output was not kept"),
                    Err(_) => tracing::warn!(execution_id, "keeping the stopped run's output took too long"),
                }
                return Disposition::Ack;
            }
            Settlement::Success | Settlement::Failure => {}
        }
        let outcome = ran.outcome;
        let duration_ms = since.elapsed().as_millis() as u64;
        let action_gone = run.runtime.is_none();
        let worker_failed = outcome.failure_kind.is_some_and(FailureKind::counts_against_worker) && !action_gone;
        let after = self.health.finish(worker_failed, duration_ms);
        // executors dispatch by the slots and the health of the last heartbeat, and time their
        // looks at a full worker by its recent execution time: a change of any is sent early
        self.reported.send_if_modified(|reported| {
            let now = (self.lookahead_now(), after.class, after.last_failure_at);
            let changed =
                (reported.0, reported.1, reported.2) != now || run_time_moved(reported.3, after.recent_duration_ms);
            if changed {
                *reported = (now.0, now.1, now.2, after.recent_duration_ms);
            }
            changed
        });
        // the `record` span: the success written here, or the failure reported to the executors
        let recording = attune_common::trace::span(
            "record",
            attune_common::trace::Kind::Producer,
            Some(execution_id),
            traceparent.as_deref(),
        );
        let result = ExecutionResult {
            trace: recording.traceparent(),
            execution_id,
            worker_id: self.id,
            status: outcome.status,
            result: outcome.result,
            failure_kind: outcome.failure_kind,
            error: outcome.error,
            exit_code: ran.exit_code,
            stdout: ran.stdout,
            stderr: ran.stderr,
            duration_ms,
            http_status: ran.http_status,
            retry_after_ms: ran.retry_after.map(|after| after.as_millis() as u64),
            run_token: Some(run_token),
        };
        attune_common::metrics::increment(
            &attune_common::metrics::ACTIONS_RUN,
            &[("runtime", runtime), ("status", result.status.as_str())],
            1,
        );
        if settled == Settlement::Failure || !self.record_success(&result).await {
            // (the row, if the database answers, and the message at once: neither waits for the
            // other)
            tokio::join!(self.keep_report(&result), self.report(&result));
        }
        drop(recording);
        drop(span);
        Disposition::Ack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_run_is_settled_by_why_it_stopped_before_by_what_it_returned() {
        use ResultStatus::{Completed, Failed};
        // (lease lost, canceled, aborted, status)
        let table = [
            ((false, false, false, Completed), Settlement::Success),
            ((false, false, false, Failed), Settlement::Failure),
            ((true, false, false, Completed), Settlement::LeaseLost),
            ((true, true, false, Failed), Settlement::LeaseLost),
            ((false, true, false, Completed), Settlement::StoppedByHand),
            // the drain deadline cancels every run: each reports what it returned
            ((false, true, true, Failed), Settlement::Failure),
            ((false, true, true, Completed), Settlement::Success),
        ];
        for ((lease_lost, canceled, aborted, status), expected) in table {
            assert_eq!(
                settlement(lease_lost, canceled, aborted, status),
                expected,
                "{lease_lost} {canceled} {aborted} {status:?}"
            );
        }
    }
}
