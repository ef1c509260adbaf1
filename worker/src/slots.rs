//! Run slots and what is held: the executions running, the dispatches taken ahead and not started,
//! and how long one may wait here before it is handed back.

use std::time::{Duration, Instant};

use attune_common::db;
use attune_common::db::execution::Patience;
use attune_common::mq::Disposition;
use tokio_util::sync::CancellationToken;

use crate::{HOLD_FLOOR, STALE_CHECK_AFTER, Worker};

/// A dispatch in the held set (marked with each heartbeat) until dropped.
pub(crate) struct Held<'a>(&'a std::sync::Mutex<std::collections::HashSet<i64>>, i64);

impl<'a> Held<'a> {
    pub(crate) fn new(set: &'a std::sync::Mutex<std::collections::HashSet<i64>>, execution_id: i64) -> Self {
        set.lock().expect("held set poisoned").insert(execution_id);
        Held(set, execution_id)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.lock().expect("held set poisoned").remove(&self.1);
    }
}

/// Counts a delivery as being handled until dropped.
pub(crate) struct Busy<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Busy<'a> {
    pub(crate) fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(count)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// An execution reserved here for the claim of one delivery (`Running::reserve`): given up when
/// dropped, unless it started (`Reserved::start`).
pub(crate) struct Reserved<'a> {
    running: &'a std::sync::Mutex<Running>,
    execution_id: i64,
    started: bool,
}

impl<'a> Reserved<'a> {
    /// `None` if the execution is being claimed or runs here already (a duplicate delivery).
    pub(crate) fn new(running: &'a std::sync::Mutex<Running>, execution_id: i64) -> Option<Self> {
        let reserved = running.lock().expect("running map poisoned").reserve(execution_id);
        reserved.then_some(Reserved { running, execution_id, started: false })
    }

    /// The execution starts: `token` stops it (at once, if a cancel notice came already) and
    /// `kill` kills its process group, until the run ends (the `Started` dropped).
    pub(crate) fn start(mut self, token: &CancellationToken, kill: &CancellationToken) -> Started<'a> {
        self.started = true;
        self.running.lock().expect("running map poisoned").start(self.execution_id, token, kill);
        Started { running: self.running, execution_id: self.execution_id }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if !self.started {
            self.running.lock().expect("running map poisoned").release(self.execution_id);
        }
    }
}

/// An execution running here, until dropped.
pub(crate) struct Started<'a> {
    running: &'a std::sync::Mutex<Running>,
    execution_id: i64,
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        self.running.lock().expect("running map poisoned").end(self.execution_id);
    }
}

/// The executions running here and the cancel notices that came before their run started, under
/// one lock so that a notice racing the start of its execution is never lost.
#[derive(Default)]
pub(crate) struct Running {
    pub(crate) tokens: std::collections::HashMap<i64, CancellationToken>,
    canceled_early: std::collections::HashSet<i64>,
    /// Executions being claimed here (between `reserve` and `start` or `release`).
    claiming: std::collections::HashSet<i64>,
    /// When each running execution started.
    since: std::collections::HashMap<i64, Instant>,
    /// The token of each running execution that kills its process group at once.
    pub(crate) kills: std::collections::HashMap<i64, CancellationToken>,
}

impl Running {
    /// Reserves the claim of an execution for this delivery: `false` if it is being claimed or
    /// runs here already (a duplicate delivery).
    pub(crate) fn reserve(&mut self, execution_id: i64) -> bool {
        !self.tokens.contains_key(&execution_id) && self.claiming.insert(execution_id)
    }

    /// Gives up a reservation (the claim did not happen).
    pub(crate) fn release(&mut self, execution_id: i64) {
        self.claiming.remove(&execution_id);
    }

    /// Registers a starting execution; a notice that already came cancels it at once.
    pub(crate) fn start(&mut self, execution_id: i64, token: &CancellationToken, kill: &CancellationToken) {
        self.claiming.remove(&execution_id);
        if self.canceled_early.remove(&execution_id) {
            token.cancel();
        }
        self.tokens.insert(execution_id, token.clone());
        self.since.insert(execution_id, Instant::now());
        self.kills.insert(execution_id, kill.clone());
    }

    /// The execution's run has ended.
    pub(crate) fn end(&mut self, execution_id: i64) {
        self.tokens.remove(&execution_id);
        self.since.remove(&execution_id);
        self.kills.remove(&execution_id);
    }

    /// How long the youngest run has been going, when `slots` runs or more take every run slot:
    /// no dispatch held now can start before one of them ends. `None` while a slot is free.
    pub(crate) fn every_slot_busy_for(&self, slots: usize) -> Option<Duration> {
        if self.since.len() < slots.max(1) {
            return None;
        }
        self.since.values().map(Instant::elapsed).min()
    }

    /// Whether the execution is being claimed or runs here.
    pub(crate) fn is_here(&self, execution_id: i64) -> bool {
        self.tokens.contains_key(&execution_id) || self.claiming.contains(&execution_id)
    }

    /// Cancels a running execution (true), or remembers the notice for one about to start.
    pub(crate) fn cancel(&mut self, execution_id: i64) -> bool {
        match self.tokens.get(&execution_id) {
            Some(token) => {
                token.cancel();
                true
            }
            None => {
                if self.canceled_early.len() > 10_000 {
                    self.canceled_early.clear();
                }
                self.canceled_early.insert(execution_id);
                false
            }
        }
    }
}

impl Worker {
    /// The dispatches to take ahead now (see `selection::lookahead`): sized from the recent
    /// execution time, and, while every run slot is taken, never more than how long the youngest
    /// of those runs has been going allows; none once it has gone on longer than a dispatch may
    /// be held (`hold_limit`): a worker stuck behind long runs takes nothing ahead that another
    /// worker could start at once (and what it holds goes back).
    pub(crate) fn lookahead_now(&self) -> u16 {
        let recent = self.health.recent_duration_ms();
        let usual = self.settings.lookahead(recent);
        let busy = self
            .running
            .lock()
            .expect("running map poisoned")
            .every_slot_busy_for(usize::from(self.settings.concurrency));
        match busy {
            Some(busy) if busy >= self.hold_limit() => 0,
            Some(busy) => {
                usual.min(self.settings.lookahead(Some(recent.unwrap_or(0.0).max(busy.as_secs_f64() * 1000.0))))
            }
            None => usual,
        }
    }

    /// How long a dispatch taken ahead waits for a run slot before it goes back to waiting for
    /// any worker (`HOLD_FLOOR`, or twice what a full look-ahead expects to wait at the recent
    /// execution time, if longer).
    pub(crate) fn hold_limit(&self) -> Duration {
        let recent = self.health.recent_duration_ms().filter(|d| d.is_finite() && *d > 0.0).unwrap_or(0.0);
        let lookahead = f64::from(self.settings.lookahead(Some(recent)));
        let rounds = (lookahead / f64::from(self.settings.concurrency.max(1))).ceil().max(1.0);
        HOLD_FLOOR.max(Duration::from_secs_f64((2.0 * rounds * recent / 1000.0).min(86_400.0)))
    }

    /// A run slot for a dispatch that arrived while every slot was taken. One that waits longer
    /// than `STALE_CHECK_AFTER` is checked once: a stale dispatch (canceled, handed back, taken
    /// elsewhere) must not wait for, and then hold, a slot that executors count as free. A short
    /// wait, the usual one under load, costs no read. `None`: the dispatch is stale.
    pub(crate) async fn wait_for_slot(&self, execution_id: i64) -> Option<tokio::sync::SemaphorePermit<'_>> {
        tokio::select! {
            permit = self.run_slots.acquire() => return permit.ok(),
            _ = tokio::time::sleep(STALE_CHECK_AFTER) => {}
        }
        match db::execution::worker::still_dispatched(&self.db, execution_id, self.id).await {
            Ok(false) => {
                tracing::debug!(execution_id, "dispatch is stale or a duplicate");
                return None;
            }
            Ok(true) => {}
            // (checked again by the claim)
            Err(e) => tracing::debug!(execution_id, error = %e, "could not check a held dispatch"),
        }
        // (the semaphore is never closed)
        self.run_slots.acquire().await.ok()
    }

    /// A dispatch this worker will not start goes back to waiting (scheduled → requested, fenced
    /// by this worker): no retry is spent. The executors are told at once.
    pub(crate) async fn hand_back(&self, execution_id: i64) -> Disposition {
        let handed_back = db::execution::worker::hand_back_own(&self.db, execution_id, self.id, Patience::Surely).await;
        match handed_back {
            Ok(Some(_)) => {
                tracing::info!(execution_id, "stopping: dispatch handed back");
                attune_common::metrics::increment(&attune_common::metrics::HANDED_BACK, &[("by", "worker")], 1);
                let hint = attune_common::mq::ExecutionRequest { execution_id, action_id: None };
                if let Err(e) = self.publisher.publish(attune_common::mq::REQUEST_KEY, &hint).await {
                    tracing::debug!(execution_id, error = %e, "no hint for the handed-back execution; the executors' sweep finds it");
                }
                Disposition::Ack
            }
            Ok(None) => Disposition::Ack,
            Err(e) => {
                tracing::warn!(execution_id, error = %e, "could not hand back a dispatch");
                Disposition::Retry
            }
        }
    }

    /// A dispatch held here and not started goes back to waiting for any worker (scheduled →
    /// requested, fenced by this worker: no retry spent), with one try: if the database cannot be
    /// reached, the message's redelivery or the monitor hands it back.
    pub(crate) async fn give_back_held(&self, execution_id: i64, why: &str) {
        match db::execution::worker::hand_back_own(&self.db, execution_id, self.id, Patience::Once).await {
            Ok(Some(_)) => {
                tracing::info!(execution_id, why, "dispatch held here and not started handed back");
                attune_common::metrics::increment(&attune_common::metrics::HANDED_BACK, &[("by", "worker")], 1);
                let hint = attune_common::mq::ExecutionRequest { execution_id, action_id: None };
                if let Err(e) = self.publisher.publish(attune_common::mq::REQUEST_KEY, &hint).await {
                    tracing::debug!(execution_id, error = %e, "no hint for the handed-back execution; the executors' sweep finds it");
                }
            }
            Ok(None) => tracing::debug!(execution_id, "held dispatch is stale"),
            Err(e) => tracing::warn!(execution_id, why, error = %e, "could not hand back a held dispatch"),
        }
    }
}

#[cfg(test)]
mod running_tests {
    use super::*;

    #[test]
    fn one_claim_per_execution_at_a_time_and_early_notices_are_kept() {
        let mut running = Running::default();
        assert!(running.reserve(1));
        assert!(!running.reserve(1), "a second delivery while the first claims");
        running.release(1);
        assert!(running.reserve(1), "a claim that did not happen frees the execution");
        let token = CancellationToken::new();
        running.start(1, &token, &CancellationToken::new());
        assert!(!running.reserve(1), "a second delivery while it runs");
        assert!(!running.cancel(2), "a notice before its run starts");
        assert!(running.reserve(2));
        let early = CancellationToken::new();
        running.start(2, &early, &CancellationToken::new());
        assert!(early.is_cancelled(), "the early notice cancels it as it starts");
        assert!(running.cancel(1) && token.is_cancelled());
    }

    #[test]
    fn an_execution_is_here_while_it_is_claimed_or_runs() {
        let mut running = Running::default();
        assert!(!running.is_here(1));
        assert!(running.reserve(1));
        assert!(running.is_here(1), "being claimed");
        running.release(1);
        assert!(!running.is_here(1));
        assert!(running.reserve(1));
        running.start(1, &CancellationToken::new(), &CancellationToken::new());
        assert!(running.is_here(1), "running");
        running.end(1);
        assert!(!running.is_here(1));
    }

    #[test]
    fn a_reservation_is_given_up_when_dropped_unstarted_and_a_run_ends_when_its_guard_drops() {
        let running = std::sync::Mutex::new(Running::default());
        let here = |id| running.lock().unwrap().is_here(id);
        let reserved = Reserved::new(&running, 1).expect("the first delivery reserves");
        assert!(Reserved::new(&running, 1).is_none(), "a second delivery while the first claims");
        drop(reserved);
        assert!(!here(1), "a claim that did not happen frees the execution");
        let token = CancellationToken::new();
        let started = Reserved::new(&running, 1).unwrap().start(&token, &CancellationToken::new());
        assert!(here(1), "running");
        assert!(Reserved::new(&running, 1).is_none(), "a second delivery while it runs");
        assert!(running.lock().unwrap().cancel(1) && token.is_cancelled());
        drop(started);
        assert!(!here(1), "its run ended");
    }
}
