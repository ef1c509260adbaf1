//! Cancel notices, the check that stops runs the database no longer has here, and follow
//! requests (`live`).

use std::sync::Arc;
use std::time::Duration;

use attune_common::db;
use attune_common::mq::{Disposition, Incoming};
use tokio_util::sync::CancellationToken;

use crate::Worker;

impl Worker {
    /// Every `ATTUNE_WORKER_CANCEL_CHECK_SECS`, while something runs here: stops each running
    /// action whose execution is no longer running on this worker in the database (canceled,
    /// failed by hand, or taken over), so that a cancel notice lost on the way (the broker
    /// connection down, the worker busy reconnecting) still stops it within that interval.
    pub(crate) async fn cancel_check_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.cancel_check.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let running: Vec<i64> = self.running.lock().expect("running map poisoned").tokens.keys().copied().collect();
            if running.is_empty() {
                continue;
            }
            match db::execution::worker::no_longer_running_on(&self.db, self.id, &running).await {
                Ok(ended) => {
                    for execution_id in ended {
                        if self.running.lock().expect("running map poisoned").cancel(execution_id) {
                            tracing::info!(
                                execution_id,
                                "canceled in the database (no notice came): stopping the action"
                            );
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "could not check running executions for cancellations"),
            }
        }
    }

    /// A cancel notice: stop the execution if it runs (or is being claimed) here and the database
    /// says it no longer should. A notice is not believed by itself (anyone who can publish to the
    /// broker can send one); the API changes the row before it sends its own, so a genuine notice
    /// always finds the row changed. A notice for an execution not here needs no read: a claim of
    /// it after the change misses.
    pub(crate) async fn handle_control(self: &Arc<Self>, incoming: Incoming) -> Disposition {
        let notice = match attune_common::mq::ControlMessage::parse(&incoming.data) {
            Ok(attune_common::mq::ControlMessage::Cancel(notice)) => notice,
            Ok(attune_common::mq::ControlMessage::Follow(request)) => {
                self.follow(request);
                return Disposition::Ack;
            }
            Ok(attune_common::mq::ControlMessage::Fence(notice)) => {
                self.handle_fence(&notice);
                return Disposition::Ack;
            }
            Err(e) => {
                tracing::warn!(error = %e, "unparseable control message ignored");
                return Disposition::Ack;
            }
        };
        let execution_id = notice.execution_id;
        if !self.running.lock().expect("running map poisoned").is_here(execution_id) {
            return Disposition::Ack;
        }
        // (checked apart from the consumer: a database that does not answer must not hold up the
        // fence notices behind this one, which the worker reads as they come)
        let worker = self.clone();
        tokio::spawn(async move {
            match db::execution::worker::still_on(&worker.db, execution_id, worker.id).await {
                Ok(true) => tracing::warn!(
                    execution_id,
                    worker_id = worker.id,
                    "cancel notice ignored: the execution still runs here"
                ),
                Ok(false) => {
                    if worker.running.lock().expect("running map poisoned").cancel(execution_id) {
                        tracing::info!(execution_id, "cancel notice: stopping the action");
                    }
                }
                // the database check every ATTUNE_WORKER_CANCEL_CHECK_SECS stops it if it was canceled
                Err(e) => tracing::warn!(execution_id, error = %e, "could not check a cancel notice in the database"),
            }
        });
        Disposition::Ack
    }

    /// A follow request: stream the execution's output to the follower for the lease, if it runs
    /// here (no database read: a forged request makes this worker publish an execution's output
    /// to a queue of `ns.output`, which only the API's broker user can bind; see
    /// `docs/security-broker.md`).
    fn follow(self: &Arc<Self>, request: attune_common::mq::FollowRequest) {
        if !self.publisher.topology().is_follower_queue(&request.follower) {
            tracing::debug!(
                execution_id = request.execution_id,
                "follow request for a queue not a follower's: ignored"
            );
            return;
        }
        let Some(run) = self.live.lock().expect("live map poisoned").get(&request.execution_id).cloned() else {
            return;
        };
        if run.follow(&request.follower, std::time::Instant::now()) {
            tracing::debug!(execution_id = request.execution_id, "followed: streaming its output");
            let worker = self.clone();
            tokio::spawn(async move { crate::live::stream(run, &worker.publisher).await });
        }
    }
}
