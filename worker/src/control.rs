//! Cancel notices, and the check that stops runs the database no longer has here.

use super::*;

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
            match db::execution::no_longer_running_on(&self.db, self.id, &running).await {
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
    pub(crate) async fn handle_control(&self, incoming: Incoming) -> Disposition {
        let notice = match serde_json::from_slice::<attune_common::mq::CancelNotice>(&incoming.data) {
            Ok(notice) => notice,
            Err(e) => {
                tracing::warn!(error = %e, "unparseable control message ignored");
                return Disposition::Ack;
            }
        };
        let execution_id = notice.execution_id;
        if !self.running.lock().expect("running map poisoned").is_here(execution_id) {
            return Disposition::Ack;
        }
        match db::execution::still_on(&self.db, execution_id, self.id).await {
            Ok(true) => tracing::warn!(
                execution_id,
                worker_id = self.id,
                "cancel notice ignored: the execution still runs here"
            ),
            Ok(false) => {
                if self.running.lock().expect("running map poisoned").cancel(execution_id) {
                    tracing::info!(execution_id, "cancel notice: stopping the action");
                }
            }
            // the database check every ATTUNE_WORKER_CANCEL_CHECK_SECS stops it if it was canceled
            Err(e) => tracing::warn!(execution_id, error = %e, "could not check a cancel notice in the database"),
        }
        Disposition::Ack
    }
}
