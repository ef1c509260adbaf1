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
//! `ATTUNE_WORKER_CACHE_MS` (500 ms); the in-flight counts are read for every decision. The cost of
//! a decision so follows the work in flight, not the number of registered workers. A worker's
//! report is at most one heartbeat old anyway; the cache adds at most its own age to that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attune_common::db;
use attune_common::health::HealthProbeConfig;
use attune_common::selection::{self, Candidate, Ranked};
use sqlx::PgPool;

#[derive(Default)]
struct Slots {
    next_id: u64,
    /// reservation id → (worker, when it was released)
    slots: HashMap<u64, (i64, Option<Instant>)>,
}

pub struct WorkerHealthProbe {
    pool: PgPool,
    config: HealthProbeConfig,
    slots: Arc<Mutex<Slots>>,
    fleet_ttl: Duration,
    fleet: tokio::sync::Mutex<Option<(Instant, Arc<Vec<Candidate>>)>>,
}

/// A decision not yet visible in the database; dropping it marks it released.
pub struct Reservation {
    id: u64,
    slots: Arc<Mutex<Slots>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut slots = self.slots.lock().expect("reservations poisoned");
        if let Some(slot) = slots.slots.get_mut(&self.id) {
            slot.1 = Some(Instant::now());
        }
    }
}

/// Released reservations older than this are forgotten (far longer than any database read).
const RELEASED_KEPT: Duration = Duration::from_secs(5);

impl WorkerHealthProbe {
    pub fn new(pool: PgPool, config: HealthProbeConfig) -> Self {
        Self::with_fleet_cache(pool, config, Duration::ZERO)
    }

    /// With the fleet read at most every `fleet_ttl` (zero: for every decision).
    pub fn with_fleet_cache(pool: PgPool, config: HealthProbeConfig, fleet_ttl: Duration) -> Self {
        WorkerHealthProbe { pool, config, slots: Arc::default(), fleet_ttl, fleet: Default::default() }
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
        let read_started = Instant::now();
        let (inflight, now) = db::worker::inflight(&self.pool).await?;
        // only the workers offering the runtime are candidates: copy those alone
        let mut candidates: Vec<Candidate> =
            fleet.iter().filter(|c| c.runtimes.iter().any(|r| r == runtime)).cloned().collect();
        db::worker::add_inflight(&mut candidates, &inflight);
        let mut slots = self.slots.lock().expect("reservations poisoned");
        slots.slots.retain(|_, (_, released)| released.is_none_or(|at| at.elapsed() < RELEASED_KEPT));
        let mut pending: HashMap<i64, i64> = HashMap::new();
        for (worker, released) in slots.slots.values() {
            if released.is_none_or(|at| at > read_started) {
                *pending.entry(*worker).or_default() += 1;
            }
        }
        for candidate in &mut candidates {
            candidate.signals.queue_depth += pending.get(&candidate.worker_id).copied().unwrap_or(0);
        }
        let Some(chosen) = selection::select(&self.config, &candidates, runtime, now, |_| rand::random()) else {
            return Ok(None);
        };
        slots.next_id += 1;
        let id = slots.next_id;
        slots.slots.insert(id, (chosen.worker_id, None));
        Ok(Some((chosen, Reservation { id, slots: self.slots.clone() })))
    }
}
