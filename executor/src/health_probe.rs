//! The `WorkerHealthProbe`: reads the workers' reported health and in-flight work from the
//! database and picks the worker for an execution with `common::selection` (healthy by queue
//! depth, then degraded by queue depth, never unhealthy).
//!
//! One executor schedules many requests at once. Until a choice is committed as `scheduled`, the
//! database cannot count it, so the probe also counts its own choices (a reservation per
//! decision): a burst spreads over the workers instead of every concurrent decision seeing the
//! same depths. A reservation released (its assignment committed) after a decision's database
//! read began still counts for that decision, so no choice is ever counted zero times; it may be
//! counted twice for a moment, which errs on the safe side.
//!
//! The fleet (who is active, offering what, reporting what) is read at most every
//! `ATTUNE_WORKER_CACHE_MS` (500 ms). The in-flight counts are read at most every
//! `ATTUNE_INFLIGHT_CACHE_MS` (20 ms), one read at a time, shared by the decisions made meanwhile:
//! under load many decisions share one read, and because every reservation released after a
//! read began still counts for the decisions that use that read, this executor's own choices are
//! never missed; other executors' choices and finished executions are seen up to that much later
//! (finished ones counted too long errs on the safe side). The cost of a decision so follows the
//! work in flight, not the number of registered workers. A worker's report is at most one
//! heartbeat old anyway; the fleet cache adds at most its own age to that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attune_common::db;
use attune_common::health::{HealthClass, HealthProbeConfig, HealthSignals, classify};
use attune_common::selection::{self, Candidate, Ranked};
use sqlx::PgPool;

/// This executor's reservations: the ones held (decided, not yet committed) and, in the order
/// they were released, the recently released ones. A decision counts every held one and the
/// released ones newer than its read, walking back from the newest only as far as that read.
#[derive(Default)]
struct Slots {
    next_id: u64,
    /// reservation id → worker
    held: HashMap<u64, i64>,
    /// (when, worker), oldest first
    released: std::collections::VecDeque<(Instant, i64)>,
}

impl Slots {
    /// Reservations per worker that a read begun at `read_started` cannot have seen.
    fn pending(&mut self, read_started: Instant, now: Instant, kept: Duration) -> HashMap<i64, i64> {
        while self.released.front().is_some_and(|(at, _)| now.duration_since(*at) >= kept) {
            self.released.pop_front();
        }
        let mut pending: HashMap<i64, i64> = HashMap::new();
        for worker in self.held.values() {
            *pending.entry(*worker).or_default() += 1;
        }
        for (_, worker) in self.released.iter().rev().take_while(|(at, _)| *at > read_started) {
            *pending.entry(*worker).or_default() += 1;
        }
        pending
    }
}

pub struct WorkerHealthProbe {
    pool: PgPool,
    config: HealthProbeConfig,
    slots: Arc<Mutex<Slots>>,
    fleet_ttl: Duration,
    fleet: tokio::sync::Mutex<Option<(Instant, Arc<Vec<Candidate>>)>>,
    inflight_ttl: Duration,
    inflight: tokio::sync::Mutex<Option<InflightRead>>,
    shortlists: Mutex<Shortlists>,
}

/// Per runtime, the workers that may get work by the current fleet and in-flight reads: those
/// offering the runtime that these reads alone do not make unhealthy. A decision adds only its
/// pending reservations and the time passed since the reads, which can make a worker worse, never
/// better; so it need look at these alone, and the cost of a decision follows the workers that
/// can take work, not the size of the fleet. Rebuilt whenever either read is renewed.
#[derive(Default)]
struct Shortlists {
    fleet: Option<Arc<Vec<Candidate>>>,
    read_started: Option<Instant>,
    by_runtime: HashMap<String, Arc<Vec<(i64, HealthSignals)>>>,
}

/// One read of the executions in flight per worker.
#[derive(Clone)]
struct InflightRead {
    /// When the read began: reservations released after this still count.
    started: Instant,
    counts: Arc<HashMap<i64, i64>>,
    /// The database's clock at the read.
    now: chrono::DateTime<chrono::Utc>,
}

/// A decision not yet visible in the database; dropping it marks it released.
pub struct Reservation {
    id: u64,
    slots: Arc<Mutex<Slots>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut slots = self.slots.lock().expect("reservations poisoned");
        if let Some(worker) = slots.held.remove(&self.id) {
            slots.released.push_back((Instant::now(), worker));
        }
    }
}

/// Released reservations older than this (plus the in-flight cache's age) are forgotten: far
/// longer than any database read.
const RELEASED_KEPT: Duration = Duration::from_secs(5);

impl WorkerHealthProbe {
    /// A probe that reads the fleet and the in-flight counts for every decision.
    pub fn new(pool: PgPool, config: HealthProbeConfig) -> Self {
        WorkerHealthProbe {
            pool,
            config,
            slots: Arc::default(),
            fleet_ttl: Duration::ZERO,
            fleet: Default::default(),
            inflight_ttl: Duration::ZERO,
            inflight: Default::default(),
            shortlists: Default::default(),
        }
    }

    /// Reads the fleet at most every `ttl`.
    pub fn with_fleet_cache(mut self, ttl: Duration) -> Self {
        self.fleet_ttl = ttl;
        self
    }

    /// Reads the in-flight counts at most every `ttl`, one read at a time.
    pub fn with_inflight_cache(mut self, ttl: Duration) -> Self {
        self.inflight_ttl = ttl;
        self
    }

    async fn inflight(&self) -> Result<InflightRead, sqlx::Error> {
        let read = || async {
            let started = Instant::now();
            let (counts, now) = db::worker::inflight(&self.pool).await?;
            Ok::<_, sqlx::Error>(InflightRead { started, counts: Arc::new(counts), now })
        };
        if self.inflight_ttl.is_zero() {
            return read().await;
        }
        // held across the read: decisions arriving meanwhile wait for it and share it
        let mut cached = self.inflight.lock().await;
        if let Some(fresh) = cached.as_ref().filter(|r| r.started.elapsed() < self.inflight_ttl) {
            return Ok(fresh.clone());
        }
        let fresh = read().await?;
        *cached = Some(fresh.clone());
        Ok(fresh)
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

    pub fn config(&self) -> &HealthProbeConfig {
        &self.config
    }

    /// The best worker for `runtime` now (with its reservation), or `None` when no active worker
    /// is eligible.
    pub async fn select_worker(&self, runtime: &str) -> Result<Option<(Ranked, Reservation)>, sqlx::Error> {
        let fleet = self.fleet().await?;
        let inflight = self.inflight().await?;
        let read_started = inflight.started;
        let shortlist = self.shortlist(runtime, &fleet, &inflight);
        let now = inflight.now + inflight.started.elapsed();
        let mut slots = self.slots.lock().expect("reservations poisoned");
        // kept longer than any read in use can be old
        let pending = slots.pending(read_started, Instant::now(), RELEASED_KEPT + self.inflight_ttl);
        let workers = shortlist.iter().map(|(worker_id, signals)| {
            let queue_depth = signals.queue_depth + pending.get(worker_id).copied().unwrap_or(0);
            (*worker_id, HealthSignals { queue_depth, ..*signals })
        });
        let Some(chosen) = selection::best(&self.config, workers, now, |_| rand::random()) else {
            return Ok(None);
        };
        slots.next_id += 1;
        let id = slots.next_id;
        slots.held.insert(id, chosen.worker_id);
        Ok(Some((chosen, Reservation { id, slots: self.slots.clone() })))
    }

    /// The workers offering `runtime` that these reads do not make unhealthy, with their
    /// in-flight counts (see `Shortlists`).
    fn shortlist(
        &self,
        runtime: &str,
        fleet: &Arc<Vec<Candidate>>,
        inflight: &InflightRead,
    ) -> Arc<Vec<(i64, HealthSignals)>> {
        let mut shortlists = self.shortlists.lock().expect("shortlists poisoned");
        let current = shortlists.fleet.as_ref().is_some_and(|f| Arc::ptr_eq(f, fleet))
            && shortlists.read_started == Some(inflight.started);
        if !current {
            *shortlists = Shortlists {
                fleet: Some(fleet.clone()),
                read_started: Some(inflight.started),
                by_runtime: HashMap::new(),
            };
        }
        if let Some(shortlist) = shortlists.by_runtime.get(runtime) {
            return shortlist.clone();
        }
        let shortlist: Arc<Vec<(i64, HealthSignals)>> = Arc::new(
            fleet
                .iter()
                .filter(|c| c.runtimes.iter().any(|r| r == runtime))
                .map(|c| (c.worker_id, db::worker::with_inflight(c, &inflight.counts)))
                .filter(|(_, signals)| classify(&self.config, signals, inflight.now) != HealthClass::Unhealthy)
                .collect(),
        );
        shortlists.by_runtime.insert(runtime.to_string(), shortlist.clone());
        shortlist
    }
}
