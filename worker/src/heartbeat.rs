//! Heartbeats (capabilities, health, slots, what it holds), the lease on runs they renew (ADR
//! 0008), and the look-ahead they report.

use std::sync::Arc;
use std::time::Duration;

use attune_common::db;
use tokio_util::sync::CancellationToken;

use crate::health::HealthState;
use crate::runner::Runtimes;
use crate::{LEASE_CHECK, LOOKAHEAD_CHECK, Settings, Worker, supervise};

/// The worker's lease on its runs (ADR 0008), on the boot clock (`supervise::boot_clock_ns`: it
/// counts while the machine sleeps, as the database's clock does). It runs `length` from the
/// last heartbeat that landed, or longer while the executors say none of them may take this
/// worker for dead (`fence`, ADR 0011).
pub(crate) struct Lease {
    /// When the last heartbeat that landed was sent.
    renewed: std::sync::Mutex<u128>,
    /// Until when the executors' notices let runs go on whatever the heartbeats (0: not at all).
    held_until: std::sync::Mutex<u128>,
    /// How many looks found it run out: a claim during which this changed must not start its run.
    lapses: std::sync::atomic::AtomicU64,
    /// (nanoseconds: it shrinks to the lease of an executor's shorter heartbeat limit)
    length: std::sync::atomic::AtomicU64,
    /// The deadline last told the supervisors, which the file's writes are serialized on.
    written: std::sync::Mutex<u128>,
    /// The last write of the lease file failed (a full or read-only temp dir): written again at
    /// every renewal until one lands.
    file_failing: std::sync::atomic::AtomicBool,
}

impl Lease {
    pub(crate) fn new(sent: u128, length: Duration) -> Lease {
        Lease {
            renewed: std::sync::Mutex::new(sent),
            held_until: Default::default(),
            lapses: Default::default(),
            length: std::sync::atomic::AtomicU64::new(length.as_nanos() as u64),
            written: Default::default(),
            file_failing: Default::default(),
        }
    }

    /// A heartbeat sent at `sent` landed; `true` if that renews the lease.
    pub(crate) fn renew(&self, sent: u128) -> bool {
        let mut renewed = self.renewed.lock().expect("lease poisoned");
        let newer = sent > *renewed;
        *renewed = (*renewed).max(sent);
        newer
    }

    pub(crate) fn length(&self) -> Duration {
        Duration::from_nanos(self.length.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// An executor judges heartbeats by a shorter limit: the lease keeps inside it.
    pub(crate) fn shorten_to(&self, length: Duration) {
        self.length.fetch_min(length.as_nanos() as u64, std::sync::atomic::Ordering::SeqCst);
    }

    /// The executors' notices let runs go on until `until` (boot clock; replaces the last hold).
    pub(crate) fn hold(&self, until: u128) {
        *self.held_until.lock().expect("lease poisoned") = until;
    }

    /// When it runs out unless renewed or held longer (boot clock).
    pub(crate) fn deadline(&self) -> u128 {
        let renewed = *self.renewed.lock().expect("lease poisoned");
        let held_until = *self.held_until.lock().expect("lease poisoned");
        (renewed + self.length().as_nanos()).max(held_until)
    }

    /// How long since the last heartbeat that landed was sent.
    pub(crate) fn silent_for(&self) -> Duration {
        let renewed = *self.renewed.lock().expect("lease poisoned");
        let nanos = supervise::boot_clock_ns().saturating_sub(renewed);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Whether it has run out: no run may start.
    pub(crate) fn expired(&self) -> bool {
        supervise::boot_clock_ns() >= self.deadline()
    }

    /// A look found it run out.
    pub(crate) fn lapsed(&self) {
        self.lapses.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn lapses(&self) -> u64 {
        self.lapses.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether it has held without a break since `lapses` was read (`lapses()`): not run out
    /// now, and no look found it run out meanwhile.
    pub(crate) fn held_since(&self, lapses: u64) -> bool {
        self.lapses() == lapses && !self.expired()
    }

    /// Tells the supervisors the deadline, if it moved since they were last told: the
    /// long-lived one over its socket, the per-action fallbacks through the lease file (written
    /// again, while its last write failed, until one lands). Returns whether the file now fails
    /// where it did not, or the other way round, after telling `changed` so under the writes'
    /// lock (two renewals at once cannot leave it told the older state).
    pub(crate) fn tell(
        &self,
        supervisor: Option<&supervise::client::Supervisor>,
        changed: impl FnOnce(bool),
    ) -> Option<bool> {
        use std::sync::atomic::Ordering::SeqCst;
        let mut written = self.written.lock().expect("lease poisoned");
        let deadline = self.deadline();
        let failing = self.file_failing.load(SeqCst);
        if deadline == *written && !failing {
            return None;
        }
        if deadline != *written {
            *written = deadline;
            if let Some(supervisor) = supervisor {
                supervisor.send_lease(deadline);
            }
        }
        let path = supervise::lease_file()?;
        let now_failing = match supervise::write_lease(path, deadline) {
            Ok(()) => false,
            Err(e) => {
                // (only a per-action fallback supervisor reads the file)
                tracing::warn!(path = %path.display(), error = %e, "could not renew the lease file");
                true
            }
        };
        let change = (self.file_failing.swap(now_failing, SeqCst) != now_failing).then_some(now_failing);
        if let Some(failing) = change {
            changed(failing);
        }
        change
    }
}

/// This process as the holder of its worker name.
pub(crate) fn this_instance() -> db::worker::Instance {
    static INSTANCE: std::sync::OnceLock<db::worker::Instance> = std::sync::OnceLock::new();
    INSTANCE
        .get_or_init(|| {
            let read = |path: &str| std::fs::read_to_string(path).map(|t| t.trim().to_string()).unwrap_or_default();
            db::worker::Instance {
                host: read("/etc/hostname"),
                pid: std::process::id(),
                boot: read("/proc/sys/kernel/random/boot_id"),
                pid_ns: std::fs::read_link("/proc/self/ns/pid").map(|l| l.display().to_string()).unwrap_or_default(),
            }
        })
        .clone()
}

/// What a heartbeat reports: what executors schedule by (runtimes, slots, health, whether it
/// consumes and opens secrets) and who holds the name.
pub(crate) fn capabilities(
    settings: &Settings,
    queue: &str,
    runtimes: &Runtimes,
    health: &HealthState,
    lookahead: u16,
    consuming: bool,
    draining: bool,
) -> serde_json::Value {
    serde_json::json!({
        "instance": this_instance(),
        "draining": draining,
        "runtimes": runtimes.offered(),
        "concurrency": settings.concurrency,
        "prefetch": lookahead,
        "slots": settings.concurrency.saturating_add(lookahead),
        // how soon its runs free room: the scheduler looks again about then (not sooner) while
        // its slots are full
        "recent_execution_time_ms": health.recent_duration_ms(),
        "consuming": consuming,
        "queue": queue,
        "health": health.report(),
        // without the key, it is given only runs whose parameters need none
        "opens_secrets": settings.sealer.is_some(),
    })
}

impl Worker {
    /// Tells the supervisors the lease (`Lease::tell`). A lease file that cannot be renewed
    /// would have a per-action fallback supervisor kill its run once the deadline in the file
    /// passes, and any run may need such a supervisor: so from its first failed write until one
    /// lands again the worker reports itself unhealthy (at once, with an early heartbeat) and
    /// hands back what it is dispatched instead of starting it (`dispatch`).
    pub(crate) fn tell_lease(&self) {
        let unfit = |failing| self.health.set_unfit(failing);
        let Some(failing) = self.lease.tell(self.runtimes.shared_supervisor(), unfit) else { return };
        match failing {
            true => tracing::error!(
                worker_id = self.id,
                "the lease file cannot be renewed: this worker reports itself unhealthy and starts nothing new until it can"
            ),
            false => {
                tracing::info!(worker_id = self.id, "the lease file is renewed again: this worker takes work again")
            }
        }
        self.reported.send_modify(|_| {});
    }
}

impl Worker {
    /// Heartbeats every interval, at once when its consumer goes up or down, and early (at most
    /// once a second) when its look-ahead, its health class or its last failure changed; after a failed one (the database away) it
    /// tries again every second, so the worker is not taken for dead once the database is back.
    /// Each heartbeat also marks the dispatches it holds as held.
    pub(crate) async fn heartbeat_loop(self: Arc<Self>, stop: CancellationToken) {
        const EARLIEST: Duration = Duration::from_secs(1);
        let mut delay = self.settings.heartbeat_interval;
        let mut consuming = self.consuming.subscribe();
        let mut reported = self.reported.subscribe();
        let mut last_beat = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
                changed = consuming.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                changed = reported.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    reported.mark_unchanged();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep_until(last_beat + EARLIEST) => {}
                    }
                }
            }
            last_beat = tokio::time::Instant::now();
            let up = *consuming.borrow_and_update();
            let draining = self.draining.load(std::sync::atomic::Ordering::SeqCst);
            let lookahead = self.lookahead_now();
            let capabilities =
                capabilities(&self.settings, &self.queue, &self.runtimes, &self.health, lookahead, up, draining);
            // What it holds is marked with the heartbeat: executors take a dispatch its heartbeat
            // did not mark for lost (`db::execution::monitor::lost_dispatches`). A heartbeat that hangs
            // (the database unreachable without a reset) is given up in time for the next.
            let held: Vec<i64> = self.held.lock().expect("held set poisoned").iter().copied().collect();
            let budget = self.settings.lease() / 2;
            let sent = supervise::boot_clock_ns();
            let keep = async {
                if held.is_empty() {
                    return Ok(());
                }
                tokio::time::timeout(budget, db::execution::worker::keep_held(&self.db, self.id, &held))
                    .await
                    .unwrap_or(Err(sqlx::Error::PoolTimedOut))
            };
            let beat = async {
                tokio::time::timeout(budget, db::worker::heartbeat(&self.db, self.id, &capabilities))
                    .await
                    .unwrap_or(Err(sqlx::Error::PoolTimedOut))
            };
            let (kept, beat) = tokio::join!(keep, beat);
            if let Err(e) = kept {
                tracing::warn!(error = %e, "could not mark held dispatches");
            }
            delay = match beat {
                Ok(true) => {
                    if self.lease.renew(sent) {
                        self.tell_lease();
                    }
                    self.settings.heartbeat_interval
                }
                Ok(false) => {
                    tracing::error!(
                        worker_id = self.id,
                        name = %self.settings.name,
                        "another process took this worker's name (its heartbeat looked stale): stopping its runs and exiting"
                    );
                    self.displaced.store(true, std::sync::atomic::Ordering::SeqCst);
                    self.abort.cancel();
                    self.shutdown.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "heartbeat failed");
                    self.settings.heartbeat_interval.min(Duration::from_secs(1))
                }
            };
        }
    }

    /// The lease on this worker's runs (docs/adr/0008-a-worker-holds-a-lease-on-its-runs.md):
    /// every `LEASE_CHECK`, if no heartbeat has landed for `Settings::lease`, every run here is
    /// stopped (its process group killed) before executors may take the worker for dead and run
    /// its executions elsewhere, and reported as `worker_heartbeat_stale` (retried; a report
    /// that comes after an executor already recorded the worker's death is stale and dropped).
    pub(crate) async fn lease_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(LEASE_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut holding = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let silent_for = self.lease.silent_for();
            let lease = self.lease.length();
            if silent_for < lease {
                holding = false;
                continue;
            }
            if !self.lease.expired() {
                if !holding {
                    tracing::warn!(
                        silent_for_ms = silent_for.as_millis() as u64,
                        lease_ms = lease.as_millis() as u64,
                        "no heartbeat has landed within the lease, but no executor can take this worker for dead \
                         (they cannot reach the database either): the runs go on"
                    );
                    attune_common::metrics::increment(&attune_common::metrics::LEASE_HOLDS, &[], 1);
                    holding = true;
                }
                continue;
            }
            holding = false;
            self.lease.lapsed();
            let running = self.running.lock().expect("running map poisoned");
            let mut lost = self.lease_lost.lock().expect("lease poisoned");
            for (execution_id, token) in &running.tokens {
                if lost.insert(*execution_id) {
                    if let Some(kill) = running.kills.get(execution_id) {
                        kill.cancel();
                    }
                    tracing::error!(
                        execution_id,
                        silent_for_ms = silent_for.as_millis() as u64,
                        lease_ms = lease.as_millis() as u64,
                        "no heartbeat has landed within the lease: stopping the run before it may be run elsewhere"
                    );
                    token.cancel();
                }
            }
        }
    }

    /// While runs take every slot, the look-ahead shrinks as they age (`lookahead_now`): a change
    /// is reported with an early heartbeat. Checked every `LOOKAHEAD_CHECK`.
    pub(crate) async fn lookahead_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(LOOKAHEAD_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let lookahead = self.lookahead_now();
            self.reported.send_if_modified(|reported| std::mem::replace(&mut reported.0, lookahead) != lookahead);
        }
    }
}
