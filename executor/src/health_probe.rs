//! The `WorkerHealthProbe`: reads the workers' reported health and in-flight work from the
//! database and picks the worker for an execution with `common::selection` (healthy by queue
//! depth, then degraded by queue depth, never unhealthy).
//!
//! One executor schedules many requests at once. Until a choice is committed as `scheduled`, the
//! database cannot count it, so the probe also counts its own choices in flight (a reservation per
//! decision, released once the assignment is committed or abandoned): a burst spreads over the
//! workers instead of every concurrent decision seeing the same depths.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use attune_common::db;
use attune_common::health::HealthProbeConfig;
use attune_common::selection::{self, Ranked};
use sqlx::PgPool;

pub struct WorkerHealthProbe {
    pool: PgPool,
    config: HealthProbeConfig,
    reserved: Arc<Mutex<HashMap<i64, i64>>>,
}

/// A decision not yet visible in the database; dropping it releases the worker's slot.
pub struct Reservation {
    worker_id: i64,
    reserved: Arc<Mutex<HashMap<i64, i64>>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut reserved = self.reserved.lock().expect("reservations poisoned");
        if let Some(count) = reserved.get_mut(&self.worker_id) {
            *count -= 1;
            if *count <= 0 {
                reserved.remove(&self.worker_id);
            }
        }
    }
}

impl WorkerHealthProbe {
    pub fn new(pool: PgPool, config: HealthProbeConfig) -> Self {
        WorkerHealthProbe { pool, config, reserved: Arc::default() }
    }

    pub fn config(&self) -> &HealthProbeConfig {
        &self.config
    }

    /// The best worker for `runtime` now (with its reservation), or `None` when no active worker
    /// is eligible.
    pub async fn select_worker(&self, runtime: &str) -> Result<Option<(Ranked, Reservation)>, sqlx::Error> {
        let (mut candidates, now) = db::worker::candidates(&self.pool).await?;
        let mut reserved = self.reserved.lock().expect("reservations poisoned");
        for candidate in &mut candidates {
            candidate.signals.queue_depth += reserved.get(&candidate.worker_id).copied().unwrap_or(0);
        }
        let Some(chosen) = selection::select(&self.config, &candidates, runtime, now, |_| rand::random()) else {
            return Ok(None);
        };
        *reserved.entry(chosen.worker_id).or_default() += 1;
        let reservation = Reservation { worker_id: chosen.worker_id, reserved: self.reserved.clone() };
        Ok(Some((chosen, reservation)))
    }
}
