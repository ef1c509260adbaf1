//! attune-executor: turns execution requests into dispatches to workers, and worker results into
//! recorded outcomes.
//!
//! - `scheduler`: places waiting requests on workers with a free slot (`attune_core::selection`),
//!   per runtime, oldest first, and dispatches them to those workers' queues.
//! - `completion`: records a worker's failure (or a success it could not record) with a guarded
//!   transition.
//! - `retry_manager`: records failures and creates their retries (delayed, linked).
//! - `retry_timer`: requests delayed retries when they are due.
//! - `dead_letters`: the DLQ handler (expired dispatches, poison messages, parking).
//! - `monitor`: the singleton timeout monitor (stuck states, dead workers, overdue runs).
//! - `schedules`: creates the runs of due schedules, each once whatever executors look.
//! - `workflows`: advances workflow runs, each step an ordinary execution.
//!
//! The quick reference's "Configuration" section, as written, is how the executor's two
//! components are made:
//!
//! ```no_run
//! use attune_executor::{HealthProbeConfig, RetryConfig, RetryManager, WorkerHealthProbe};
//! # async fn initialization(pool: sqlx::PgPool) {
//! // In executor service initialization
//! let retry_manager = RetryManager::new(pool.clone(), RetryConfig {
//! enabled: true,
//! base_backoff_secs: 1,
//! max_backoff_secs: 300,
//! backoff_multiplier: 2.0,
//! jitter_factor: 0.2,
//! });
//! // In executor service initialization
//! let health_probe = WorkerHealthProbe::new(pool.clone(), HealthProbeConfig {
//! enabled: true,
//! heartbeat_max_age_secs: 30,
//! degraded_threshold: 3,
//! unhealthy_threshold: 10,
//! queue_depth_degraded: 50,
//! queue_depth_unhealthy: 100,
//! failure_rate_degraded: 0.3,
//! failure_rate_unhealthy: 0.7,
//! });
//! # let _ = (retry_manager, health_probe);
//! # }
//! ```

pub use attune_core::health::HealthProbeConfig;
pub use attune_core::retry::RetryConfig;
pub use health_probe::WorkerHealthProbe;
pub use retry_manager::RetryManager;

pub mod completion;
pub mod dead_letters;
pub mod fence;
pub mod health_probe;
pub mod history;
pub mod monitor;
pub mod retry_manager;
pub mod retry_timer;
pub mod scheduler;
pub mod schedules;
pub mod workflows;

use std::sync::Arc;
use std::time::Duration;

use attune_common::config::{CommonSettings, ConfigError, FromEnv, Source, read};
use attune_common::db;
use attune_common::mq::{ConsumerSpec, Publisher, Topology, run_consumer};
use attune_core::health::HealthThresholds;
use attune_core::retry::RetrySettings;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use attune_common::ServiceError as Error;

#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    pub health: HealthThresholds,
    pub retry: RetrySettings,
    /// How often the retry timer looks for due retries (`ATTUNE_RETRY_POLL_MS`, 100).
    pub retry_poll: Duration,
    /// Messages handled concurrently by each of the executor's consumers
    /// (`ATTUNE_EXECUTOR_PREFETCH`, 64).
    pub prefetch: u16,
    pub worker_queue_ttl: Duration,
    /// A request fails as `worker_unavailable` only when no active worker that could take work
    /// has offered its runtime for this long (`ATTUNE_WORKER_WAIT_SECS`, 30). While one does, a
    /// request waits as long as it takes.
    pub worker_wait: Duration,
    /// How long the scheduler reuses its read of the fleet (`ATTUNE_WORKER_CACHE_MS`, 500).
    pub worker_cache: Duration,
    /// How often the scheduler looks again, re-reading the executions in flight per worker,
    /// while requests wait for room, and how long after a claim that used the room up
    /// (`ATTUNE_INFLIGHT_CACHE_MS`, 10; at least 5).
    pub inflight_cache: Duration,
    /// How long an action read from the database is reused (`ATTUNE_ACTION_CACHE_SECS`, 5; 0: never).
    pub action_cache_ttl: Duration,
    /// How often the timeout monitor sweeps (`ATTUNE_MONITOR_INTERVAL_SECS`, 5).
    pub monitor_interval: Duration,
    /// `scheduling` this long is stuck (`ATTUNE_SCHEDULING_TIMEOUT_SECS`, 30).
    pub scheduling_timeout: Duration,
    /// Slack past the queue TTL for `scheduled`, and past `timeout_seconds` for `running`
    /// (`ATTUNE_MONITOR_GRACE_SECS`, 30).
    pub running_grace: Duration,
    /// `ATTUNE_HEALTH_PROBATION_SECS` (60): how long after its last failure a worker that its
    /// failures made unhealthy gets a probe execution.
    pub probation: Duration,
    pub history: history::HistorySettings,
}

impl Settings {
    pub fn from_env() -> Result<Self, ConfigError> {
        <Self as FromEnv>::from_env()
    }
}

impl FromEnv for Settings {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        Ok(Settings {
            common: CommonSettings::from_source(source)?,
            health: HealthThresholds::from_source(source)?,
            retry: RetrySettings::from_source(source)?,
            retry_poll: Duration::from_millis(read(source, "ATTUNE_RETRY_POLL_MS")?),
            prefetch: read(source, "ATTUNE_EXECUTOR_PREFETCH")?,
            worker_queue_ttl: Duration::from_secs(read(source, "ATTUNE_WORKER_QUEUE_TTL_SECS")?),
            worker_wait: Duration::from_secs_f64(read(source, "ATTUNE_WORKER_WAIT_SECS")?),
            worker_cache: Duration::from_millis(read(source, "ATTUNE_WORKER_CACHE_MS")?),
            inflight_cache: Duration::from_millis(read::<u64>(source, "ATTUNE_INFLIGHT_CACHE_MS")?.max(5)),
            action_cache_ttl: Duration::from_secs_f64(read(source, "ATTUNE_ACTION_CACHE_SECS")?),
            monitor_interval: Duration::from_secs_f64(read(source, "ATTUNE_MONITOR_INTERVAL_SECS")?),
            scheduling_timeout: Duration::from_secs_f64(read(source, "ATTUNE_SCHEDULING_TIMEOUT_SECS")?),
            running_grace: Duration::from_secs_f64(read(source, "ATTUNE_MONITOR_GRACE_SECS")?),
            probation: Duration::from_secs_f64(read(source, "ATTUNE_HEALTH_PROBATION_SECS")?),
            history: history::HistorySettings {
                retention: attune_core::retention::Retention {
                    completed: read(source, "ATTUNE_RETENTION_COMPLETED")?,
                    failed: read(source, "ATTUNE_RETENTION_FAILED")?,
                    timeout: read(source, "ATTUNE_RETENTION_TIMEOUT")?,
                    canceled: read(source, "ATTUNE_RETENTION_CANCELED")?,
                    abandoned: read(source, "ATTUNE_RETENTION_ABANDONED")?,
                },
                workers: read(source, "ATTUNE_RETENTION_WORKERS")?,
                audit: read(source, "ATTUNE_RETENTION_AUDIT")?,
                archive: read(source, "ATTUNE_RETENTION_ARCHIVE")?,
                interval: Duration::from_secs_f64(read::<f64>(source, "ATTUNE_HISTORY_INTERVAL_SECS")?.max(0.1)),
                batch: read::<i64>(source, "ATTUNE_RETENTION_BATCH")?.clamp(1, 10_000),
            },
        })
    }
}

/// What the handlers share.
pub struct Context {
    pub db: PgPool,
    pub health_probe: health_probe::WorkerHealthProbe,
    pub retry_manager: retry_manager::RetryManager,
    /// The runtimes that may have waiting requests, and the scheduler's wake-up.
    pub waiting: scheduler::Waiting,
    /// Dispatches being published: waited for (a few seconds at most) when the executor stops,
    /// so that a claimed execution is not left `scheduled` without its dispatch.
    pub dispatches: tokio_util::task::TaskTracker,
    /// Actions read recently (one read fewer per execution under steady traffic).
    pub actions: db::action::ActionCache,
    pub publisher: Publisher,
    /// When this executor may take a silent worker for dead (`fence`).
    pub fence: fence::Judging,
    /// The workflow runs to advance (`workflows`).
    pub workflows: workflows::Marks,
    pub settings: Settings,
}

/// The counters alerts watch for a first occurrence, present at 0 from the start: a series
/// born at 1 would show no `increase()` for that first one.
fn zero_counters() {
    use attune_common::metrics::{FAILURES, PARKED_MESSAGES, increment};
    for kind in attune_core::FailureKind::ALL {
        increment(&FAILURES, &[("failure_kind", kind.as_str())], 0);
    }
    increment(&PARKED_MESSAGES, &[], 0);
}

/// Runs the executor until `shutdown` fires.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), Error> {
    zero_counters();
    let pool =
        db::connect_checking(&settings.common.database_url, 16, Duration::from_secs(60), db::Check::AfterIdle).await?;
    db::check_schema(&pool).await?;
    db::worker::store_health_config(&pool, &settings.health).await?;
    db::worker::store_retry_config(&pool, &settings.retry).await?;
    let topology = Topology::new(&settings.common.mq_namespace, settings.worker_queue_ttl);
    let publisher = Publisher::new(&settings.common.amqp_url, "attune-executor", topology.clone());
    let health_probe = health_probe::WorkerHealthProbe::new(pool.clone(), settings.health.clone())
        .with_fleet_cache(settings.worker_cache)
        .with_probation(settings.probation);
    let retry_manager = retry_manager::RetryManager::new(pool.clone(), settings.retry.clone());
    let context = Arc::new(Context {
        db: pool,
        health_probe,
        retry_manager,
        actions: db::action::ActionCache::new(settings.action_cache_ttl),
        waiting: Default::default(),
        dispatches: tokio_util::task::TaskTracker::new(),
        publisher,
        fence: fence::Judging::new(settings.health.heartbeat_max_age()),
        workflows: Default::default(),
        settings: settings.clone(),
    });
    tracing::info!(namespace = %topology.namespace, "executor starting");
    attune_common::metrics::serve_from_env(shutdown.clone());

    let consumer = |queue: String, name: &str| ConsumerSpec {
        url: settings.common.amqp_url.clone(),
        name: format!("attune-executor-{name}"),
        queue,
        prefetch: settings.prefetch,
        topology: topology.clone(),
        worker_queue: None,
        fanout: None,
        drain: Duration::from_secs(10),
        consuming: None,
    };
    let scheduler = {
        let context = context.clone();
        run_consumer(consumer(topology.requests_queue(), "scheduler"), shutdown.clone(), move |incoming| {
            let context = context.clone();
            async move { scheduler::handle(&context, incoming).await }
        })
    };
    let completion = {
        let context = context.clone();
        run_consumer(consumer(topology.results_queue(), "completion"), shutdown.clone(), move |incoming| {
            let context = context.clone();
            async move { completion::handle(&context, incoming).await }
        })
    };
    let dead_letters = {
        let context = context.clone();
        run_consumer(consumer(topology.dead_letter_queue(), "dlq"), shutdown.clone(), move |incoming| {
            let context = context.clone();
            async move { dead_letters::handle(&context, incoming).await }
        })
    };
    let dispatcher = scheduler::run(context.clone(), shutdown.clone());
    let announcements =
        scheduler::listen(&settings.common.database_url, &context.waiting, &context.workflows, shutdown.clone());
    let workflows = workflows::run(context.clone(), shutdown.clone());
    let monitor = monitor::run(context.clone(), shutdown.clone());
    let fence = fence::run(context.clone(), shutdown.clone());
    let retry_timer = retry_timer::run(context.clone(), shutdown.clone());
    let history = history::run(context.clone(), shutdown.clone());
    let schedules = schedules::run(context.clone(), shutdown.clone());
    tokio::join!(
        scheduler,
        dispatcher,
        announcements,
        completion,
        dead_letters,
        monitor,
        fence,
        retry_timer,
        history,
        schedules,
        workflows
    );
    context.dispatches.close();
    if tokio::time::timeout(Duration::from_secs(20), context.dispatches.wait()).await.is_err() {
        tracing::warn!("dispatches still being published at shutdown; the monitor hands their executions back");
    }
    tracing::info!("executor stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_common::config::Defaults;

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let s = Settings::from_source(&Defaults).unwrap();
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        assert_eq!((s.retry_poll, s.prefetch, s.worker_queue_ttl), (ms(100), 64, secs(300)));
        assert_eq!((s.worker_wait, s.worker_cache, s.inflight_cache), (secs(30), ms(500), ms(10)));
        assert_eq!((s.action_cache_ttl, s.monitor_interval), (secs(5), secs(5)));
        assert_eq!((s.scheduling_timeout, s.running_grace), (secs(30), secs(30)));
        assert_eq!((s.retry, s.health), (RetrySettings::default(), HealthThresholds::default()));
        assert_eq!(s.history.retention, attune_core::retention::Retention::default());
        let h = &s.history;
        assert_eq!(
            (h.workers, h.archive, h.interval, h.batch),
            (attune_core::retention::Age::days(7), false, secs(30), 500)
        );
    }
}
