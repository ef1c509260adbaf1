//! The `WorkerHealthProbe`: reads the workers' reported health and in-flight work from the
//! database and picks the worker for an execution with `common::selection` (healthy by queue
//! depth, then degraded by queue depth, never unhealthy).

use attune_common::db;
use attune_common::health::HealthProbeConfig;
use attune_common::selection::{self, Ranked};
use sqlx::PgPool;

pub struct WorkerHealthProbe {
    pool: PgPool,
    config: HealthProbeConfig,
}

impl WorkerHealthProbe {
    pub fn new(pool: PgPool, config: HealthProbeConfig) -> Self {
        WorkerHealthProbe { pool, config }
    }

    pub fn config(&self) -> &HealthProbeConfig {
        &self.config
    }

    /// The best worker for `runtime` now, or `None` when no active worker is eligible.
    pub async fn select_worker(&self, runtime: &str) -> Result<Option<Ranked>, sqlx::Error> {
        let (candidates, now) = db::worker::candidates(&self.pool).await?;
        Ok(selection::select(&self.config, &candidates, runtime, now, |_| rand::random()))
    }
}
