//! One execution of a dispatch, from its delivery to the end of its run, in five stages:
//!
//! | stage | file | what it decides | its way out early |
//! |---|---|---|---|
//! | admit | `admit.rs` | whether the dispatch may start here now (a run slot, the lease, the worker's fitness) | back to waiting for any worker, or the message back to the queue |
//! | claim | `claim.rs` | what to run, read from the record in the claim (scheduled → running, fenced by this worker and a run token) | stale or a duplicate: nothing; the lease ran out meanwhile: reported, not started |
//! | prepare | `prepare.rs` | the run as the runner takes it: its span, its secrets opened, its live output | none: what cannot be prepared becomes the run's outcome |
//! | execute | `execute.rs` | the outcome: the action run (or not, when its action is gone or its secrets cannot be opened), redacted | none |
//! | settle | `settle.rs` | what the outcome becomes: a success written here, a failure reported to the executors, a stopped run's output kept | none |
//!
//! The order is what holds the guarantees, and it is written once, in `Worker::handle_one`:
//! - a dispatch is marked held (with every heartbeat) from delivery until its claim answers, so
//!   neither the monitor nor a redelivery takes it for lost meanwhile;
//! - the lease is looked at three times: before the claim (not claimed: the dispatch goes back),
//!   after the claim's answer (claimed, not started: reported as `worker_heartbeat_stale`, so
//!   that it runs elsewhere), and after the run (stopped by the lease loop: reported the same);
//! - the run slot is held from admission to the end of the run, and given back before the
//!   outcome is written, so the next run starts meanwhile;
//! - an execution is claimed by one delivery here at a time (`slots::Reserved`), and a cancel
//!   notice that comes before its start stops it as it starts (`slots::Running`).

mod admit;
mod claim;
mod execute;
mod prepare;
mod settle;

pub(crate) use settle::release;

use attune_common::mq::{Dispatch, Disposition, Incoming};
use tokio_util::sync::CancellationToken;

use crate::Worker;
use crate::slots::{Busy, Held};

impl Worker {
    /// A dispatch message: each execution it names is claimed, run and recorded on its own, all
    /// at once (each waits for a run slot of its own). The message is acknowledged when every one
    /// is done with, and goes back to the queue if any of them must (the others are then stale
    /// duplicates there).
    pub(crate) async fn handle(&self, incoming: Incoming, shutdown: CancellationToken) -> Disposition {
        let dispatch: Dispatch = match incoming.parse("dispatch") {
            Ok(dispatch) => dispatch,
            Err(disposition) => return disposition,
        };
        // polled as they are woken (not all of them whenever one is)
        let mut each: futures_util::stream::FuturesUnordered<_> = dispatch
            .executions()
            .into_iter()
            .map(|execution_id| {
                let traced = dispatch.trace_of(execution_id).filter(|_| attune_common::trace::on());
                self.handle_one(execution_id, traced, &incoming, &shutdown)
            })
            .collect();
        let mut disposition = Disposition::Ack;
        while let Some(done) = futures_util::StreamExt::next(&mut each).await {
            if matches!(done, Disposition::Retry) {
                disposition = Disposition::Retry;
            }
        }
        disposition
    }

    /// One execution of a dispatch message, stage by stage (see the module's documentation).
    /// `dispatched`: the trace context the message names for it.
    async fn handle_one(
        &self,
        execution_id: i64,
        dispatched: Option<String>,
        incoming: &Incoming,
        shutdown: &CancellationToken,
    ) -> Disposition {
        let _busy = Busy::new(&self.busy);
        let _in_flight = self.health.start();
        let held = Held::new(&self.held, execution_id);
        let slot = match self.admit(execution_id, incoming, shutdown).await {
            Ok(slot) => slot,
            Err(disposition) => return disposition,
        };
        let claim = match self.claim(execution_id, held).await {
            Ok(claim) => claim,
            Err(disposition) => return disposition,
        };
        let prepared = self.prepare(claim, dispatched).await;
        let ran = self.execute(&prepared).await;
        self.settle(prepared, ran, slot).await
    }
}
