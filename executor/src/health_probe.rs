//! The `WorkerHealthProbe`: reads what the scheduler decides from, the workers' reported health
//! and capacity and the executions in flight on each, and turns it into the room each worker
//! has for a runtime (`attune_core::selection` does the choosing).
//!
//! The fleet (who is active and consuming, offering what, with how many slots, reporting what)
//! is read at most every `ATTUNE_WORKER_CACHE_MS` (500 ms): a worker's report is at most one
//! heartbeat old anyway. The in-flight counts are read by the scheduler once per look (see
//! `scheduler`); between two reads it adds its own claims to them, so its picture never counts a
//! slot as free that it has itself filled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use attune_common::db;
use attune_core::health::{HealthClass, HealthThresholds, classify, on_probation};
use attune_core::selection::{self, Candidate, Ranked, Room};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

pub struct WorkerHealthProbe {
    pool: PgPool,
    config: HealthThresholds,
    fleet_ttl: Duration,
    probation: chrono::Duration,
    fleet: tokio::sync::Mutex<Option<(Instant, Arc<Vec<Candidate>>)>>,
}

/// What the scheduler sees at one moment: the fleet, what is in flight on each worker (as read,
/// plus what was claimed since), and the database's clock at the read.
pub struct Picture {
    pub fleet: Arc<Vec<Candidate>>,
    inflight: HashMap<i64, i64>,
    /// Workers a lost dispatch has passed over, as read with the in-flight counts.
    not_receiving: Vec<i64>,
    read_at: Instant,
    db_now: DateTime<Utc>,
    probation: chrono::Duration,
}

impl Picture {
    /// The database's clock now (as read, plus the time since).
    pub fn now(&self) -> DateTime<Utc> {
        self.db_now + self.read_at.elapsed()
    }

    /// The database's clock when the in-flight counts were read (before any claim this picture
    /// plans).
    pub fn db_read_at(&self) -> DateTime<Utc> {
        self.db_now
    }

    /// How long ago the in-flight counts were read.
    pub fn age(&self) -> Duration {
        self.read_at.elapsed()
    }

    /// Counts `count` more executions in flight on `worker_id` (claimed after the read).
    pub fn add(&mut self, worker_id: i64, count: i64) {
        *self.inflight.entry(worker_id).or_default() += count;
    }

    /// The workers offering `runtime` that have a free slot (fewer executions dispatched to them
    /// and unfinished than their slots), with their signals (queue depth: what is in flight on
    /// them, or what they reported if that is more).
    /// Workers these reads already make unhealthy are left out: more work and a later clock
    /// never make a class better, so a plan could never choose them (and the cost of planning
    /// follows the workers that can take work, not the size of the fleet). The exception is a
    /// worker on probation (`health::on_probation`): one slot, for one probe. A worker that
    /// lately did not receive a dispatch (`not_receiving`) has none while another consuming
    /// worker offers the runtime, full or not: the execution it lost waits for room elsewhere
    /// rather than go straight back to it.
    pub fn rooms(&self, config: &HealthThresholds, runtime: &str) -> Vec<Room> {
        let now = self.now();
        let receiving = |c: &Candidate| !self.not_receiving.contains(&c.worker_id);
        let elsewhere = self.fleet.iter().any(|c| c.offers(runtime) && c.consuming && receiving(c));
        let mut rooms = Vec::new();
        // the best class of a worker with room that waits for its top-up (`refill_now`)
        let mut held_back: Option<HealthClass> = None;
        for c in self.fleet.iter().filter(|c| !elsewhere || receiving(c)).filter(|c| c.offers(runtime) && c.consuming) {
            let signals = db::worker::with_inflight(c, &self.inflight);
            // capacity counts what was dispatched and has not finished; the reported queue
            // depth (which may be higher) weighs in the health class only
            let dispatched = self.inflight.get(&c.worker_id).copied().unwrap_or(0);
            let free = c.slots.map_or(i64::MAX, |slots| slots.saturating_sub(dispatched));
            let class = classify(config, &signals, now);
            if free > 0 && class != HealthClass::Unhealthy && !refill_now(c, dispatched, free) {
                held_back = Some(held_back.map_or(class, |best| best.min(class)));
                continue;
            }
            let eligible = class != HealthClass::Unhealthy;
            let probation = !eligible && on_probation(config, &signals, now, self.probation);
            let free = if probation { free.min(1) } else { free };
            if free > 0 && (eligible || probation) {
                rooms.push(Room { worker_id: c.worker_id, signals, free, probation });
            }
        }
        // A worker waiting for its top-up keeps its place: a worse one (degraded, or on
        // probation) does not get the work meanwhile, as it would not while that worker had room.
        if let Some(best) = held_back {
            rooms.retain(|room| !room.probation && classify(config, &room.signals, now) <= best);
        }
        rooms
    }

    /// About when room for `runtime` comes free, judged from the runs the workers offering it
    /// hold and the recent execution time each reports: the soonest of them, for the first of
    /// them to have a free slot, or, holding work ahead, to be due its top-up (`refill_now`).
    /// `None` when a worker that could have room does not say enough to judge (no run timed yet,
    /// or an older version).
    pub fn room_expected_in(&self, runtime: &str) -> Option<Duration> {
        let mut soonest: Option<f64> = None;
        for c in self.fleet.iter().filter(|c| c.offers(runtime) && c.consuming) {
            let (Some(slots), Some(concurrency), Some(run_ms)) = (c.slots, c.concurrency, c.run_ms) else {
                return None;
            };
            let dispatched = self.inflight.get(&c.worker_id).copied().unwrap_or(0);
            // runs that must end first: as many as it lacks of the room it gets work at
            let ending = room_wanted(c, dispatched).saturating_sub(slots.saturating_sub(dispatched)).max(1);
            let ms = ending as f64 * run_ms / concurrency.max(1) as f64;
            soonest = Some(soonest.map_or(ms, |s| s.min(ms)));
        }
        soonest.map(|ms| Duration::from_secs_f64(ms.clamp(0.0, 3_600_000.0) / 1000.0))
    }

    /// Whether some active worker offering `runtime` would take work if it had room: a request
    /// for it waits rather than fails.
    pub fn could_run(&self, config: &HealthThresholds, runtime: &str) -> bool {
        let now = self.now();
        self.fleet.iter().any(|c| c.offers(runtime) && selection::could_take_work(config, &c.signals, now))
    }
}

/// Whether a worker with `free` slots gets work now. One that runs all it can and holds more
/// ahead is topped up once half its look-ahead has come free, not a run at a time: its queue
/// lasts meanwhile, and each top-up is a claim, a message and a delivery for several runs
/// instead of one each (`core.python_echo` at its maximum rate: a claim of 1.7 executions on
/// average). One with no more dispatched than it runs at once gets all its room at once.
fn refill_now(worker: &Candidate, dispatched: i64, free: i64) -> bool {
    free >= room_wanted(worker, dispatched)
}

/// The free slots a worker with `dispatched` executions must have to get work (`refill_now`):
/// half its look-ahead while it holds work ahead, else one.
fn room_wanted(worker: &Candidate, dispatched: i64) -> i64 {
    match (worker.slots, worker.concurrency) {
        (Some(slots), Some(concurrency)) if dispatched > concurrency => (slots.saturating_sub(concurrency) / 2).max(1),
        _ => 1,
    }
}

impl WorkerHealthProbe {
    /// A probe that reads the fleet for every picture.
    /// With the quick reference's `HealthProbeConfig` literal, or the executor's
    /// `HealthThresholds`.
    pub fn new(pool: PgPool, config: impl Into<HealthThresholds>) -> Self {
        WorkerHealthProbe {
            pool,
            config: config.into(),
            fleet_ttl: Duration::ZERO,
            probation: chrono::Duration::seconds(60),
            fleet: Default::default(),
        }
    }

    /// Reads the fleet at most every `ttl`.
    pub fn with_fleet_cache(mut self, ttl: Duration) -> Self {
        self.fleet_ttl = ttl;
        self
    }

    /// How long after its last failure an unhealthy worker gets a probe (default 60 s).
    pub fn with_probation(mut self, probation: Duration) -> Self {
        self.probation = chrono::Duration::from_std(probation).unwrap_or(chrono::Duration::MAX);
        self
    }

    pub fn config(&self) -> &HealthThresholds {
        &self.config
    }

    async fn fleet(&self) -> Result<Arc<Vec<Candidate>>, sqlx::Error> {
        let mut cached = self.fleet.lock().await;
        if let Some((read_at, fleet)) = cached.as_ref()
            && read_at.elapsed() < self.fleet_ttl
        {
            return Ok(fleet.clone());
        }
        let fleet = Arc::new(db::worker::fleet(&self.pool).await?);
        *cached = Some((Instant::now(), fleet.clone()));
        Ok(fleet)
    }

    /// A fresh picture: the fleet (from the cache if fresh) and the in-flight counts read now.
    pub async fn picture(&self) -> Result<Picture, sqlx::Error> {
        let fleet = self.fleet().await?;
        let read_at = Instant::now();
        let db::worker::InFlight { counts: inflight, now: db_now, not_receiving } =
            db::worker::in_flight(&self.pool).await?;
        attune_common::metrics::increment(&attune_common::metrics::INFLIGHT_READS, &[], 1);
        Ok(Picture { fleet, inflight, not_receiving, read_at, db_now, probation: self.probation })
    }

    /// The worker that the next execution for `runtime` would go to now, if any has room.
    pub async fn select_worker(&self, runtime: &str) -> Result<Option<Ranked>, sqlx::Error> {
        let picture = self.picture().await?;
        let now = picture.now();
        let rooms = picture.rooms(&self.config, runtime);
        let placed = selection::plan(&self.config, rooms.clone(), 1, now, |_| rand::random());
        let Some(worker_id) = placed.first() else { return Ok(None) };
        let room = rooms.iter().find(|r| r.worker_id == *worker_id).expect("a planned worker has room");
        Ok(Some(Ranked {
            worker_id: *worker_id,
            class: classify(&self.config, &room.signals, now),
            queue_depth: room.signals.queue_depth,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_core::health::HealthSignals;

    fn worker(id: i64, now: DateTime<Utc>) -> Candidate {
        Candidate {
            worker_id: id,
            name: format!("w{id}"),
            runtimes: vec!["shell".into()],
            signals: HealthSignals {
                last_heartbeat: Some(now),
                consecutive_failures: 0,
                total_executions: 0,
                failed_executions: 0,
                queue_depth: 0,
                last_failure_at: None,
            },
            slots: Some(4),
            concurrency: Some(4),
            run_ms: None,
            consuming: true,
        }
    }

    fn picture(fleet: Vec<Candidate>, inflight: HashMap<i64, i64>, now: DateTime<Utc>) -> Picture {
        Picture {
            fleet: Arc::new(fleet),
            inflight,
            not_receiving: vec![1],
            read_at: Instant::now(),
            db_now: now,
            probation: chrono::Duration::seconds(30),
        }
    }

    #[test]
    fn a_worker_holding_work_ahead_is_topped_up_by_halves_of_its_look_ahead() {
        // 4 at once and 16 ahead: (dispatched, room offered)
        let ahead = Candidate { slots: Some(20), concurrency: Some(4), ..worker(1, Utc::now()) };
        let table = [(20, false), (13, false), (12, true), (5, true), (4, true), (0, true)];
        for (dispatched, offered) in table {
            assert_eq!(refill_now(&ahead, dispatched, 20 - dispatched), offered, "{dispatched} dispatched");
        }
        // while it waits for its top-up, a degraded worker with room gets none either
        let now = Utc::now();
        let healthy = Candidate { slots: Some(20), concurrency: Some(4), ..worker(1, now) };
        let mut degraded = Candidate { slots: Some(20), concurrency: Some(4), ..worker(2, now) };
        degraded.signals.consecutive_failures = 3;
        let config = HealthThresholds::default();
        assert_eq!(classify(&config, &degraded.signals, now), HealthClass::Degraded);
        let ids = |dispatched_to_healthy: i64| -> Vec<i64> {
            let inflight = HashMap::from([(1, dispatched_to_healthy), (2, 0)]);
            Picture { not_receiving: Vec::new(), ..picture(vec![healthy.clone(), degraded.clone()], inflight, now) }
                .rooms(&config, "shell")
                .iter()
                .map(|room| room.worker_id)
                .collect()
        };
        assert_eq!(ids(13), Vec::<i64>::new(), "the healthy one waits for its top-up, and so does the work");
        assert_eq!(ids(12), [1, 2], "its top-up is due: both have room, the plan prefers the healthy one");
        assert_eq!(ids(20), [2], "the healthy one is full: the degraded one gets work, as before");
        // a worker that does not say how many it runs at once: any room
        let silent = Candidate { slots: Some(20), concurrency: None, ..worker(1, Utc::now()) };
        assert!(refill_now(&silent, 19, 1));
        // no look-ahead: a slot at a time
        let none_ahead = Candidate { slots: Some(4), concurrency: Some(4), ..worker(1, Utc::now()) };
        assert!(refill_now(&none_ahead, 3, 1) && !refill_now(&none_ahead, 4, 0));
    }

    #[test]
    fn room_is_expected_when_the_first_worker_has_a_free_slot_or_is_due_its_top_up() {
        let now = Utc::now();
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        // 4 at once and 16 ahead, runs of 100 ms: full (20 dispatched), a top-up is due once 8
        // have ended, 2 rounds of its 4 slots
        let python = Candidate { slots: Some(20), concurrency: Some(4), run_ms: Some(100.0), ..worker(1, now) };
        let of = |fleet: Vec<Candidate>, inflight: Vec<(i64, i64)>| {
            picture(fleet, inflight.into_iter().collect(), now).room_expected_in("shell")
        };
        assert_eq!(ms(of(vec![python.clone()], vec![(1, 20)])), Some(200.0));
        // 14 dispatched: 6 free already, 2 more runs to end
        assert_eq!(ms(of(vec![python.clone()], vec![(1, 14)])), Some(50.0));
        // no look-ahead: the first run to end frees a slot
        let long = Candidate { slots: Some(2), concurrency: Some(2), run_ms: Some(60_000.0), ..worker(2, now) };
        assert_eq!(ms(of(vec![long.clone()], vec![(2, 2)])), Some(30_000.0));
        // the soonest of the workers
        assert_eq!(ms(of(vec![python.clone(), long.clone()], vec![(1, 20), (2, 2)])), Some(200.0));
        // one that has timed no run (or does not say) leaves it unknown
        let untimed = Candidate { run_ms: None, ..python.clone() };
        assert_eq!(of(vec![python, untimed], vec![(1, 20)]), None);
        // a runtime no worker offers: nothing to expect
        assert_eq!(picture(vec![long], HashMap::new(), now).room_expected_in("python"), None);
    }

    #[test]
    fn a_worker_that_lost_a_dispatch_has_room_only_when_no_other_takes_its_runtime() {
        let now = Utc::now();
        let config = HealthThresholds::default();
        let rooms =
            |picture: &Picture| -> Vec<i64> { picture.rooms(&config, "shell").iter().map(|r| r.worker_id).collect() };
        // worker 1 lost a dispatch: passed over while worker 2 takes shell work, even when full
        let both = picture(vec![worker(1, now), worker(2, now)], HashMap::new(), now);
        assert_eq!(rooms(&both), [2]);
        let full = picture(vec![worker(1, now), worker(2, now)], HashMap::from([(2, 4)]), now);
        assert!(rooms(&full).is_empty(), "the lost execution waits for the other worker's room");
        let alone = picture(vec![worker(1, now)], HashMap::new(), now);
        assert_eq!(rooms(&alone), [1], "the only worker of its runtime keeps its room");
    }
}
