//! The claim: scheduled → running, fenced by this worker and a run token it draws, reading what
//! to run from the record in the same statement (`db::execution::worker::claim`, waiting out an outage, through the
//! worker's batched writes). Nothing of the message but the ids is believed: a forged dispatch
//! for an execution not scheduled here claims nothing.

use attune_common::db::execution::worker::ClaimedRun;
use attune_common::mq::Disposition;
use attune_core::FailureKind;

use crate::Worker;
use crate::record::new_run_token;
use crate::slots::{Held, Reserved};

/// An execution claimed here, not started.
pub(super) struct Claim<'a> {
    pub(super) run: ClaimedRun,
    /// The token every result of this run carries (executors record only the row's).
    pub(super) run_token: String,
    pub(super) reserved: Reserved<'a>,
}

impl Worker {
    /// Claims `execution_id` (held until the claim answers), or says how its message is answered.
    pub(super) async fn claim(&self, execution_id: i64, held: Held<'_>) -> Result<Claim<'_>, Disposition> {
        // one claim per execution in this process at a time: a second delivery of the same one
        // waits for nothing (so a claim read back after a lost acknowledgement is this one's)
        let Some(reserved) = Reserved::new(&self.running, execution_id) else {
            tracing::debug!(execution_id, "dispatch is a duplicate of one claimed or running here");
            return Err(Disposition::Ack);
        };
        let run_token = new_run_token();
        let lapses = self.lease.lapses();
        let claimed = self.writes.claim(execution_id, &run_token).await;
        drop(held);
        let run = match claimed {
            Ok(Some(run)) => run,
            Ok(None) => {
                tracing::debug!(execution_id, "dispatch is stale or a duplicate");
                return Err(Disposition::Ack);
            }
            Err(e) => {
                tracing::warn!(execution_id, error = %e, "could not claim execution");
                return Err(Disposition::Retry);
            }
        };
        if !self.lease.held_since(lapses) {
            // The claim's answer came after the lease ran out: the executors may have taken
            // this worker for dead meanwhile and started the execution elsewhere. It does not run
            // here (its failure is reported, and is stale if it was).
            drop(reserved);
            let trace = run.trace_parent.as_deref().filter(|_| attune_common::trace::on());
            let error = "the worker's lease on its runs ran out while it claimed the execution: not started";
            self.report_failure(
                execution_id,
                run_token,
                trace.and_then(attune_common::trace::valid),
                FailureKind::WorkerHeartbeatStale,
                error.into(),
            )
            .await;
            return Err(Disposition::Ack);
        }
        Ok(Claim { run, run_token, reserved })
    }
}
