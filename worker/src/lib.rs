//! attune-worker: registers itself, heartbeats its capabilities and health, consumes its own
//! queue, runs each action (a child process, or in the worker for `builtin` and `http`), records a
//! success itself and reports a failure to the executors (their RetryManager decides on the
//! retry).
//!
//! Trust: a dispatch names only the executions (one, or every one a scheduling claim placed here:
//! each handled on its own, `handle`) and the worker. The claim (`scheduled → running`, fenced
//! by this worker's id) reads what to run from PostgreSQL in the same statement and stores
//! a run token this worker drew; every result it publishes carries the token, and executors record
//! only results whose token is the row's. The entrypoint runs only from inside its pack directory
//! (`runner::resolve_entrypoint`), and a cancel notice stops a run only once the database no longer
//! has it here (see `docs/security-broker.md`).
//!
//! Capacity: the worker runs `ATTUNE_WORKER_CONCURRENCY` actions at once and takes a few more
//! dispatches ahead (delivered, held, not started: a message delivered to a consumer does not
//! expire): up to `ATTUNE_WORKER_PREFETCH`, fewer when its recent execution time says they would
//! wait longer than a quarter of the queue TTL (`selection::lookahead`). It reports the sum as
//! its `slots` with every heartbeat, and executors
//! dispatch to it only while fewer executions than that are dispatched to it and unfinished, so
//! its queue stays short and a healthy worker's dispatches never expire. It keeps what it holds
//! marked in the database with every heartbeat, and reports whether its consumer is up.
//!
//! Stopping (SIGTERM): the worker marks itself `draining` (no executor picks it from its next read
//! of the fleet on), unbinds its queue (a dispatch still sent to it is unroutable, and its sender
//! puts the execution back to waiting), hands back every dispatch it had not started
//! (scheduled → requested: no retry spent), keeps heartbeating while its running actions finish
//! (up to `ATTUNE_WORKER_DRAIN_SECS`), then deletes its queue and marks itself inactive.

pub mod destination;
pub mod health;
pub mod http;
pub mod runner;
pub mod supervise;
mod writes;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use attune_common::config::{CommonSettings, ConfigError, FromEnv, Source, read, read_optional};
use attune_common::db;
use attune_common::mq::{
    ConsumerSpec, Dispatch, Disposition, ExecutionResult, Incoming, Publisher, RESULT_KEY, ResultStatus, Topology,
    run_consumer,
};
use attune_core::health::{HealthClass, HealthThresholds};
use attune_core::{FailureKind, selection};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::destination::{ALLOW_SETTING, AllowList};
use crate::health::HealthState;
use crate::runner::{ActionRun, Ran, Runtimes};

pub use attune_common::ServiceError as Error;

#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    pub health: HealthThresholds,
    /// `ATTUNE_WORKER_NAME`; unique per worker (default, also when empty: host name and process
    /// id).
    pub name: String,
    /// `ATTUNE_WORKER_RUNTIMES`, comma separated (default `shell,python,builtin,http`).
    pub runtimes: Vec<String>,
    /// `ATTUNE_WORKER_CONCURRENCY`: actions run at once (default 4).
    pub concurrency: u16,
    /// `ATTUNE_WORKER_PREFETCH`: the most dispatches taken ahead of the running ones, delivered
    /// and held until a run slot is free (default 16; fewer for slow actions, see
    /// `selection::lookahead`). The worker's slots are concurrency plus the look-ahead.
    pub prefetch: u16,
    /// `ATTUNE_HEARTBEAT_INTERVAL_SECS` (default 10, well under the 30 s staleness limit).
    pub heartbeat_interval: Duration,
    /// `ATTUNE_WORKER_QUEUE_TTL_SECS` (default 300).
    pub queue_ttl: Duration,
    /// `ATTUNE_WORKER_DRAIN_SECS`: how long running actions may finish after a shutdown request
    /// before they are killed and reported as `worker_unavailable` (default 30).
    pub drain: Duration,
    /// `ATTUNE_WORKER_OUTPUT_LIMIT_BYTES`: stdout and stderr kept per execution (default 65536).
    pub output_limit: usize,
    /// `ATTUNE_WORKER_HEALTH_OVERRIDE_FILE`: a JSON file whose fields replace the reported health
    /// counters (to drain a worker, or to force its health in tests).
    pub health_override_file: Option<PathBuf>,
    /// `ATTUNE_WORKER_CANCEL_CHECK_SECS`: how often the worker looks in the database for
    /// cancellations of what it runs (default 2).
    pub cancel_check: Duration,
    /// `ATTUNE_HEALTH_WINDOW_SECS`: the window its failure rate is measured over (default 600).
    pub health_window_secs: i64,
    /// `ATTUNE_WORKER_HTTP_ALLOW`: the networks http actions may reach besides global addresses,
    /// comma-separated CIDRs (default none: loopback, private and other non-global destinations
    /// are refused; see `destination`).
    pub http_allow: AllowList,
    /// `ATTUNE_SECRETS_KEY_FILE`: opens the secrets an execution's parameters refer to and its
    /// secret parameters (`attune_common::secrets`); without it such executions fail as
    /// `invalid_parameters`.
    pub sealer: Option<attune_common::secrets::Sealer>,
    /// `ATTUNE_WORKER_ACTION_UIDS`: the user ids process actions run as, one of its own per
    /// running action (`runner::ActionUsers`); by default `DEFAULT_ACTION_UIDS` when the worker
    /// runs as root, and none (the worker's own user) otherwise or with `off`.
    pub action_uids: Option<std::ops::RangeInclusive<u32>>,
    /// The program that supervises each action (`supervise`): the worker's own binary, set by
    /// `attune-worker`; `None` runs actions directly (their process group still dies with a
    /// timeout or a cancel, but not with the worker).
    pub supervisor: Option<PathBuf>,
}

impl Settings {
    pub fn from_env() -> Result<Self, ConfigError> {
        <Self as FromEnv>::from_env()
    }
}

impl FromEnv for Settings {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        let default_name = format!(
            "{}-{}",
            std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "worker".into()),
            std::process::id()
        );
        let runtimes: String = read(source, "ATTUNE_WORKER_RUNTIMES")?;
        let settings = Settings {
            common: CommonSettings::from_source(source)?,
            health: HealthThresholds::from_source(source)?,
            name: read_optional(source, "ATTUNE_WORKER_NAME")
                .map(|name| name.trim().to_string())
                .unwrap_or(default_name),
            runtimes: runtimes.split(',').map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).collect(),
            concurrency: read::<u16>(source, "ATTUNE_WORKER_CONCURRENCY")?.max(1),
            prefetch: read(source, "ATTUNE_WORKER_PREFETCH")?,
            heartbeat_interval: Duration::from_secs_f64(read(source, "ATTUNE_HEARTBEAT_INTERVAL_SECS")?),
            queue_ttl: Duration::from_secs(read(source, "ATTUNE_WORKER_QUEUE_TTL_SECS")?),
            drain: Duration::from_secs(read(source, "ATTUNE_WORKER_DRAIN_SECS")?),
            output_limit: read(source, "ATTUNE_WORKER_OUTPUT_LIMIT_BYTES")?,
            health_override_file: read_optional(source, "ATTUNE_WORKER_HEALTH_OVERRIDE_FILE").map(PathBuf::from),
            cancel_check: Duration::from_secs_f64(read(source, "ATTUNE_WORKER_CANCEL_CHECK_SECS")?),
            health_window_secs: read(source, "ATTUNE_HEALTH_WINDOW_SECS")?,
            http_allow: match read_optional(source, ALLOW_SETTING) {
                None => AllowList::default(),
                Some(text) => AllowList::parse(&text).map_err(|(entry, reason)| ConfigError {
                    name: ALLOW_SETTING.into(),
                    value: entry,
                    reason: format!(
                        "{reason}; the setting is a comma-separated list of CIDRs such as 127.0.0.1/32,10.0.0.0/8"
                    ),
                })?,
            },
            sealer: attune_common::secrets::Sealer::from_source(source)?,
            action_uids: action_uids(source, running_as_root())?,
            supervisor: None,
        };
        let lease = settings.lease();
        if settings.heartbeat_interval >= lease {
            return Err(ConfigError {
                name: "ATTUNE_HEARTBEAT_INTERVAL_SECS".into(),
                value: format!("{}", settings.heartbeat_interval.as_secs_f64()),
                reason: format!(
                    "a worker stops its runs when it has not heartbeaten for {:.2} s (its lease, from \
                     ATTUNE_HEARTBEAT_MAX_AGE_SECS = {}): heartbeats must come more often than that",
                    lease.as_secs_f64(),
                    settings.health.heartbeat_max_age_secs
                ),
            });
        }
        Ok(settings)
    }
}

/// Deliveries the worker accepts beyond its slots (see `run`).
const PREFETCH_MARGIN: u16 = 2;
/// How long a dispatch waits for a run slot before it is checked for staleness (`wait_for_slot`).
const STALE_CHECK_AFTER: Duration = Duration::from_millis(50);
/// The shortest time a dispatch taken ahead waits for a run slot here before it goes back to
/// waiting for any worker (`Worker::hold_limit`).
const HOLD_FLOOR: Duration = Duration::from_secs(1);
/// The longest the worker waits to keep a run's report in its row (`Worker::keep_report`).
const REPORT_WRITE_LIMIT: Duration = Duration::from_secs(2);
/// How often the worker looks whether its lease ran out (`Worker::lease_loop`).
const LEASE_CHECK: Duration = Duration::from_millis(100);
/// How often the look-ahead is measured against the runs that take every slot.
const LOOKAHEAD_CHECK: Duration = Duration::from_millis(250);

impl Settings {
    /// How long after the start of its last heartbeat that landed the worker may go on running
    /// actions (docs/adr/0008-a-worker-holds-a-lease-on-its-runs.md): the heartbeat age after
    /// which executors take a worker for dead, less a quarter of it (at least a second) for the
    /// runs to be stopped. Executors measure that age from the heartbeat's time in the database,
    /// which is never earlier than the start of the call.
    pub fn lease(&self) -> Duration {
        let max_age = Duration::from_secs(self.health.heartbeat_max_age_secs.max(1) as u64);
        max_age.saturating_sub((max_age / 4).max(Duration::from_secs(1)))
    }

    /// The most executions this worker takes at once, started or not.
    pub fn max_slots(&self) -> u16 {
        self.concurrency.saturating_add(self.prefetch)
    }

    /// Dispatches taken ahead now, given the recent execution time.
    pub fn lookahead(&self, recent_duration_ms: Option<f64>) -> u16 {
        selection::lookahead(self.concurrency, self.prefetch, recent_duration_ms, self.queue_ttl)
    }
}

struct Worker {
    id: i64,
    queue: String,
    /// Executions running now, each with the token that stops it when a cancel notice comes.
    running: std::sync::Mutex<Running>,
    /// Run slots: `concurrency` permits.
    run_slots: tokio::sync::Semaphore,
    /// Dispatches delivered and not yet started.
    held: std::sync::Mutex<std::collections::HashSet<i64>>,
    /// Executions between delivery and the end of their handling (held or running).
    busy: std::sync::atomic::AtomicUsize,
    /// Whether the consumer of the worker's queue is up.
    consuming: tokio::sync::watch::Sender<bool>,
    /// Set once the worker is stopping: its heartbeats say so, and it stays `draining`.
    draining: std::sync::atomic::AtomicBool,
    /// What its last heartbeat reported that executors schedule by (its look-ahead and its
    /// health class); a change sends a heartbeat early.
    reported: tokio::sync::watch::Sender<Reported>,
    settings: Settings,
    db: PgPool,
    /// The claims and successes, written in batches.
    writes: writes::Writes,
    publisher: Publisher,
    runtimes: Runtimes,
    health: HealthState,
    /// Fires when the drain deadline has passed: running actions are killed.
    abort: CancellationToken,
    /// The worker's shutdown: fired by the worker itself if another process takes its name.
    shutdown: CancellationToken,
    /// Another process took this worker's name: this one stops its own runs and exits, and
    /// touches nothing it shares with the new holder (the row, the queue, their dispatches).
    displaced: std::sync::atomic::AtomicBool,
    /// The lease on its runs (ADR 0008).
    lease: Lease,
    /// Runs stopped because the lease ran out (reported as `worker_heartbeat_stale`).
    lease_lost: std::sync::Mutex<std::collections::HashSet<i64>>,
}

/// Makes this process non-dumpable, so an action running as the same (non-root) user cannot read
/// the worker's environment (`DATABASE_URL`, `AMQP_URL`) through `/proc/<pid>/environ` or attach a
/// debugger. Actions start with a clean environment either way; running them under a separate
/// user is the stronger separation.
#[allow(unsafe_code)]
fn protect_process() {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) only changes a flag of the calling process.
    let result = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if result != 0 {
        tracing::warn!("could not make the worker process non-dumpable");
    }
}

/// This process as the holder of its worker name.
fn this_instance() -> db::worker::Instance {
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

/// Whether a process of this host is alive (signal 0 probes without signalling).
#[allow(unsafe_code)]
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: kill(2) with signal 0 checks for the process's existence and has no effect.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Takes the worker's name for this process, or refuses to start while a live process holds it.
async fn claim_name(pool: &PgPool, settings: &Settings) -> Result<i64, Error> {
    let max_age = Duration::from_secs(settings.health.heartbeat_max_age_secs.max(1) as u64);
    match db::worker::claim_name(pool, &settings.name, &this_instance(), max_age, process_alive).await? {
        db::worker::NameClaim::Claimed(id) => Ok(id),
        db::worker::NameClaim::OtherLogin { login } => Err(Error::Config(ConfigError {
            name: "ATTUNE_WORKER_NAME".into(),
            value: settings.name.clone(),
            reason: format!(
                "the worker name is registered by the database login '{login}', and a worker's login takes over \
                 only the names it registered: choose another ATTUNE_WORKER_NAME, or log in as '{login}'"
            ),
        })),
        db::worker::NameClaim::Held { holder, heartbeat_age_secs } => {
            let who = holder.map(|h| format!(" (pid {} on host {})", h.pid, h.host)).unwrap_or_default();
            Err(Error::Config(ConfigError {
                name: "ATTUNE_WORKER_NAME".into(),
                value: settings.name.clone(),
                reason: format!(
                    "worker '{}' is already running{who}, its last heartbeat {heartbeat_age_secs:.1} s ago: stop it \
                     or choose another ATTUNE_WORKER_NAME (the name is free once that process stops, or once its \
                     heartbeat is {} s old)",
                    settings.name, settings.health.heartbeat_max_age_secs
                ),
            }))
        }
    }
}

/// The user ids actions run as when the worker runs as root and `ATTUNE_WORKER_ACTION_UIDS` is
/// not set: a range no account uses on a usual system (below 2^31).
pub const DEFAULT_ACTION_UIDS: std::ops::RangeInclusive<u32> = 1_900_000_000..=1_900_065_535;
const ACTION_UIDS: &str = "ATTUNE_WORKER_ACTION_UIDS";

#[allow(unsafe_code)]
fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail
    unsafe { libc::geteuid() == 0 }
}

/// `ATTUNE_WORKER_ACTION_UIDS`: `off`, `<first>-<last>` (root only), or unset (the default range
/// as root, none otherwise).
fn action_uids(source: &dyn Source, root: bool) -> Result<Option<std::ops::RangeInclusive<u32>>, ConfigError> {
    let Some(text) = read_optional(source, ACTION_UIDS) else {
        return Ok(root.then_some(DEFAULT_ACTION_UIDS));
    };
    let error = |reason: &str| ConfigError { name: ACTION_UIDS.into(), value: text.clone(), reason: reason.into() };
    if text.trim() == "off" {
        return Ok(None);
    }
    let range = text
        .trim()
        .split_once('-')
        .and_then(|(first, last)| Some(first.trim().parse::<u32>().ok()?..=last.trim().parse::<u32>().ok()?))
        .filter(|range| *range.start() > 0 && range.start() <= range.end())
        .ok_or_else(|| error("expected `off` or a range of user ids, `<first>-<last>` (first at least 1)"))?;
    if !root {
        return Err(error("running actions as other users needs the worker to run as root; set `off`"));
    }
    Ok(Some(range))
}

/// Runs a worker until `shutdown` fires.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), Error> {
    protect_process();
    let pool =
        db::connect_checking(&settings.common.database_url, 4, Duration::from_secs(60), db::Check::AfterIdle).await?;
    db::check_schema(&pool).await?;
    let runtimes = Runtimes::detect(&settings.runtimes, settings.supervisor.clone(), settings.http_allow.clone())
        .await
        .packs_under(settings.common.packs_dir.clone())
        .as_users(settings.action_uids.clone().map(runner::ActionUsers::new))
        .warn_if_packs_closed();
    let topology = Topology::new(&settings.common.mq_namespace, settings.queue_ttl);
    let publisher =
        Publisher::new(&settings.common.amqp_url, &format!("attune-worker-{}", settings.name), topology.clone());
    let health =
        HealthState::new(settings.health.clone(), settings.health_override_file.clone(), settings.health_window_secs);
    let previous_queue = db::worker::queue_of(&pool, &settings.name).await?;
    let worker_id = claim_name(&pool, &settings).await?;
    let queue = topology.worker_queue(worker_id);
    // The queue must exist before any executor can dispatch to this worker.
    publisher.declare_worker_queue(worker_id).await?;
    if let Some(previous) = previous_queue.filter(|p| *p != queue) {
        // a failure here (the old queue already gone, say) must not stop the worker
        match publisher.retire_worker_queue(&previous, worker_id).await {
            Ok(deleted) => {
                tracing::warn!(old_queue = %previous, new_queue = %queue, deleted, "the worker queue TTL changed; the old queue no longer receives work")
            }
            Err(e) => {
                tracing::warn!(old_queue = %previous, error = %e, "the worker queue TTL changed; the old queue could not be retired")
            }
        }
    }
    // not consuming yet: the heartbeat sent when the consumer is up makes it eligible
    let registered_boot = supervise::boot_clock_ns();
    let capabilities = capabilities(&settings, &queue, &runtimes, &health, settings.lookahead(None), false, false);
    if !db::worker::heartbeat(&pool, worker_id, &capabilities).await? {
        return Err(Error::Config(ConfigError {
            name: "ATTUNE_WORKER_NAME".into(),
            value: settings.name.clone(),
            reason: "another process took this worker name while it started".into(),
        }));
    }
    tracing::info!(worker_id, name = %settings.name, runtimes = ?runtimes.offered(), "worker registered");
    attune_common::metrics::serve_from_env(shutdown.clone());

    let worker = Arc::new(Worker {
        id: worker_id,
        queue: queue.clone(),
        running: Default::default(),
        run_slots: tokio::sync::Semaphore::new(settings.concurrency as usize),
        held: Default::default(),
        busy: Default::default(),
        consuming: tokio::sync::watch::Sender::new(false),
        draining: Default::default(),
        reported: tokio::sync::watch::Sender::new((settings.lookahead(None), HealthClass::Healthy, None)),
        settings: settings.clone(),
        writes: writes::Writes::start(pool.clone(), worker_id),
        db: pool,
        publisher,
        runtimes,
        health,
        abort: CancellationToken::new(),
        shutdown: shutdown.clone(),
        displaced: Default::default(),
        lease: Lease::new(registered_boot, settings.lease()),
        lease_lost: Default::default(),
    });
    if settings.supervisor.is_some() {
        // the supervisors of its actions kill them once this file's deadline passes (ADR 0008)
        let path = std::env::temp_dir().join(format!("attune-worker-{worker_id}-{}.lease", std::process::id()));
        match supervise::write_lease(&path, registered_boot + settings.lease().as_nanos()) {
            Ok(()) => supervise::set_lease_file(path),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "no lease file: a stalled worker's actions run on")
            }
        }
    }
    worker.recover_previous_run().await?;

    // Stopping has its own order (see the module's documentation): the consumer runs on until
    // the worker has handed back or finished everything and its queue is empty.
    let stop_consuming = CancellationToken::new();
    let stop_heartbeats = CancellationToken::new();
    let heartbeat = tokio::spawn(worker.clone().heartbeat_loop(stop_heartbeats.clone()));
    let cancel_check = tokio::spawn(worker.clone().cancel_check_loop(stop_heartbeats.clone()));
    let lookahead = tokio::spawn(worker.clone().lookahead_loop(stop_heartbeats.clone()));
    let lease = tokio::spawn(worker.clone().lease_loop(stop_heartbeats.clone()));
    let abort_after_drain = {
        let (abort, drain, shutdown) = (worker.abort.clone(), settings.drain, shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tokio::time::sleep(drain).await;
            abort.cancel();
        })
    };
    let draining = tokio::spawn(worker.clone().drain_when_asked(shutdown.clone(), stop_consuming.clone()));
    let spec = ConsumerSpec {
        url: settings.common.amqp_url.clone(),
        name: format!("attune-worker-{}", settings.name),
        queue,
        // a margin over the slots: a dispatch beyond them (several executors filling the same
        // slot) waits delivered, where it cannot expire, not in the queue
        prefetch: settings.max_slots().saturating_add(PREFETCH_MARGIN),
        topology: topology.clone(),
        worker_queue: Some(worker_id),
        fanout: None,
        drain: settings.drain + Duration::from_secs(5),
        consuming: Some(worker.consuming.clone()),
    };
    let control = ConsumerSpec {
        url: settings.common.amqp_url.clone(),
        name: format!("attune-worker-{}-control", settings.name),
        queue: format!("{}.control.{worker_id}.{:x}", topology.namespace, rand::random::<u32>()),
        prefetch: 16,
        fanout: Some(topology.control_exchange()),
        topology,
        worker_queue: None,
        drain: Duration::from_secs(1),
        consuming: None,
    };
    let control = tokio::spawn({
        let worker = worker.clone();
        run_consumer(control, stop_consuming.clone(), move |incoming| {
            let worker = worker.clone();
            async move { worker.handle_control(incoming).await }
        })
    });
    {
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        run_consumer(spec, stop_consuming.clone(), move |incoming| {
            let (worker, shutdown) = (worker.clone(), shutdown.clone());
            async move { worker.handle(incoming, shutdown).await }
        })
        .await;
    }
    let _ = control.await;
    let _ = draining.await;
    abort_after_drain.abort();
    stop_heartbeats.cancel();
    let _ = heartbeat.await;
    let _ = cancel_check.await;
    let _ = lookahead.await;
    let _ = lease.await;
    if worker.displaced.load(std::sync::atomic::Ordering::SeqCst) {
        tracing::warn!(worker_id, "worker stopped: its name belongs to another process now");
        return Ok(());
    }
    if shutdown.is_cancelled() {
        // whatever is still dispatched here and not started (its message lost with a channel,
        // say) waits again; a late message for it is stale
        worker.hand_back_unstarted().await;
        worker.remove_queue().await;
    }
    if let Some(path) = supervise::lease_file() {
        let _ = std::fs::remove_file(path);
    }
    if let Err(e) = db::worker::deactivate(&worker.db, worker_id).await {
        tracing::warn!(error = %e, "could not mark the worker inactive");
    }
    tracing::info!(worker_id, "worker stopped");
    Ok(())
}

fn capabilities(
    settings: &Settings,
    queue: &str,
    runtimes: &Runtimes,
    health: &HealthState,
    lookahead: u16,
    consuming: bool,
    draining: bool,
) -> serde_json::Value {
    json!({
        "instance": this_instance(),
        "draining": draining,
        "runtimes": runtimes.offered(),
        "concurrency": settings.concurrency,
        "prefetch": lookahead,
        "slots": settings.concurrency.saturating_add(lookahead),
        "consuming": consuming,
        "queue": queue,
        "health": health.report(),
    })
}

impl Worker {
    /// The dispatches to take ahead now (see `selection::lookahead`): sized from the recent
    /// execution time, and, while every run slot is taken, never more than how long the youngest
    /// of those runs has been going allows; none once it has gone on longer than a dispatch may
    /// be held (`hold_limit`): a worker stuck behind long runs takes nothing ahead that another
    /// worker could start at once (and what it holds goes back).
    fn lookahead_now(&self) -> u16 {
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
    fn hold_limit(&self) -> Duration {
        let recent = self.health.recent_duration_ms().filter(|d| d.is_finite() && *d > 0.0).unwrap_or(0.0);
        let lookahead = f64::from(self.settings.lookahead(Some(recent)));
        let rounds = (lookahead / f64::from(self.settings.concurrency.max(1))).ceil().max(1.0);
        HOLD_FLOOR.max(Duration::from_secs_f64((2.0 * rounds * recent / 1000.0).min(86_400.0)))
    }

    /// While runs take every slot, the look-ahead shrinks as they age (`lookahead_now`): a change
    /// is reported with an early heartbeat. Checked every `LOOKAHEAD_CHECK`.
    async fn lookahead_loop(self: Arc<Self>, stop: CancellationToken) {
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

    /// The lease on this worker's runs (docs/adr/0008-a-worker-holds-a-lease-on-its-runs.md):
    /// every `LEASE_CHECK`, if no heartbeat has landed for `Settings::lease`, every run here is
    /// stopped (its process group killed) before executors may take the worker for dead and run
    /// its executions elsewhere, and reported as `worker_heartbeat_stale` (retried; a report
    /// that comes after an executor already recorded the worker's death is stale and dropped).
    async fn lease_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(LEASE_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let lease = self.settings.lease();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let silent_for = self.lease.silent_for();
            if silent_for < lease {
                continue;
            }
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

    /// Hands back every execution dispatched to this worker that has not started.
    async fn hand_back_unstarted(&self) {
        match db::retry_while_unavailable("reading unstarted dispatches", || {
            db::execution::scheduled_on(&self.db, self.id)
        })
        .await
        {
            Ok(ids) => {
                for execution_id in ids {
                    let _ = self.hand_back(execution_id).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read unstarted dispatches; the monitor hands them back"),
        }
    }

    /// Executions this worker's previous process left `running` died with it: report them as
    /// `worker_heartbeat_stale` so the executors record (and retry) them. What it left dispatched
    /// and unstarted (in a queue this process may no longer read, after an upgrade or a TTL change)
    /// goes back to waiting.
    async fn recover_previous_run(&self) -> Result<(), Error> {
        self.hand_back_unstarted().await;
        // (each result carries the token the earlier process drew: the executor records only that)
        let orphans = db::execution::runs_on(&self.db, self.id).await?;
        for (execution_id, run_token) in orphans {
            tracing::warn!(execution_id, "execution was running when this worker last stopped");
            let result = failure_result(
                execution_id,
                self.id,
                run_token,
                FailureKind::WorkerHeartbeatStale,
                "the worker restarted while the action was running".into(),
            );
            self.publisher.publish(RESULT_KEY, &result).await?;
        }
        Ok(())
    }

    /// Heartbeats every interval, at once when its consumer goes up or down, and early (at most
    /// once a second) when its look-ahead, its health class or its last failure changed; after a failed one (the database away) it
    /// tries again every second, so the worker is not taken for dead once the database is back.
    /// Each heartbeat also marks the dispatches it holds as held.
    async fn heartbeat_loop(self: Arc<Self>, stop: CancellationToken) {
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
            // did not mark for lost (`db::execution::lost_dispatches`). A heartbeat that hangs
            // (the database unreachable without a reset) is given up in time for the next.
            let held: Vec<i64> = self.held.lock().expect("held set poisoned").iter().copied().collect();
            let budget = self.settings.lease() / 2;
            let sent = supervise::boot_clock_ns();
            let keep = async {
                if held.is_empty() {
                    return Ok(());
                }
                tokio::time::timeout(budget, db::execution::keep_held(&self.db, self.id, &held))
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
                    if self.lease.renew(sent)
                        && let Some(path) = supervise::lease_file()
                        && let Err(e) = supervise::write_lease(path, sent + self.settings.lease().as_nanos())
                    {
                        tracing::warn!(path = %path.display(), error = %e, "could not renew the lease file");
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

    /// Every `ATTUNE_WORKER_CANCEL_CHECK_SECS`, while something runs here: stops each running
    /// action whose execution is no longer running on this worker in the database (canceled,
    /// failed by hand, or taken over), so that a cancel notice lost on the way (the broker
    /// connection down, the worker busy reconnecting) still stops it within that interval.
    async fn cancel_check_loop(self: Arc<Self>, stop: CancellationToken) {
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

    /// On a shutdown request: stop receiving new work, hand back what has not started, let what
    /// runs finish, then stop the consumers once the queue is empty (see the module's
    /// documentation).
    async fn drain_when_asked(self: Arc<Self>, shutdown: CancellationToken, stop_consuming: CancellationToken) {
        shutdown.cancelled().await;
        if self.displaced.load(std::sync::atomic::Ordering::SeqCst) {
            // the row and the queue are the new holder's: only wait for the own runs to end
            while self.busy.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop_consuming.cancel();
            return;
        }
        tracing::info!(worker_id = self.id, "stopping: draining");
        self.draining.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Err(e) =
            db::retry_while_unavailable("marking the worker draining", || db::worker::drain(&self.db, self.id)).await
        {
            tracing::warn!(error = %e, "could not mark the worker draining");
        }
        if let Err(e) = self.publisher.unbind_worker_queue(self.id).await {
            tracing::warn!(error = %e, "could not unbind the worker queue");
        }
        // everything delivered is handed back or finished (the abort after the drain deadline
        // ends the runs), and nothing waits in the queue; checked every 100 ms
        let mut pause = tokio::time::interval(Duration::from_millis(100));
        loop {
            pause.tick().await;
            if self.busy.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                continue;
            }
            match self.publisher.queue_length(&self.queue).await {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the worker queue's length; stopping anyway");
                    break;
                }
            }
        }
        stop_consuming.cancel();
    }

    /// Deletes the worker's queue (empty by now; the delete is refused otherwise).
    async fn remove_queue(&self) {
        match self.publisher.retire_worker_queue(&self.queue, self.id).await {
            Ok(true) => tracing::info!(queue = %self.queue, "worker queue deleted"),
            Ok(false) => tracing::warn!(queue = %self.queue, "worker queue not empty; left to expire"),
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "could not delete the worker queue; left to expire")
            }
        }
    }

    /// A dispatch this worker will not start goes back to waiting (scheduled → requested, fenced
    /// by this worker): no retry is spent. The executors are told at once.
    async fn hand_back(&self, execution_id: i64) -> Disposition {
        let handed_back = db::execution::hand_back_own_surely(&self.db, execution_id, self.id).await;
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
    async fn give_back_held(&self, execution_id: i64, why: &str) {
        match db::execution::hand_back_own(&self.db, execution_id, self.id).await {
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

    /// A run slot for a dispatch that arrived while every slot was taken. One that waits longer
    /// than `STALE_CHECK_AFTER` is checked once: a stale dispatch (canceled, handed back, taken
    /// elsewhere) must not wait for, and then hold, a slot that executors count as free. A short
    /// wait, the usual one under load, costs no read. `None`: the dispatch is stale.
    async fn wait_for_slot(&self, execution_id: i64) -> Option<tokio::sync::SemaphorePermit<'_>> {
        tokio::select! {
            permit = self.run_slots.acquire() => return permit.ok(),
            _ = tokio::time::sleep(STALE_CHECK_AFTER) => {}
        }
        match db::execution::still_dispatched(&self.db, execution_id, self.id).await {
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

    /// A dispatch message: each execution it names is claimed, run and recorded on its own, all
    /// at once (each waits for a run slot of its own). The message is acknowledged when every one
    /// is done with, and goes back to the queue if any of them must (the others are then stale
    /// duplicates there).
    async fn handle(&self, incoming: Incoming, shutdown: CancellationToken) -> Disposition {
        let dispatch: Dispatch = match incoming.parse("dispatch") {
            Ok(dispatch) => dispatch,
            Err(disposition) => return disposition,
        };
        // polled as they are woken (not all of them whenever one is)
        let mut each: futures_util::stream::FuturesUnordered<_> = dispatch
            .executions()
            .into_iter()
            .map(|execution_id| self.handle_one(execution_id, &incoming, &shutdown))
            .collect();
        let mut disposition = Disposition::Ack;
        while let Some(done) = futures_util::StreamExt::next(&mut each).await {
            if matches!(done, Disposition::Retry) {
                disposition = Disposition::Retry;
            }
        }
        disposition
    }

    /// One execution of a dispatch message.
    async fn handle_one(&self, execution_id: i64, incoming: &Incoming, shutdown: &CancellationToken) -> Disposition {
        let _busy = Busy::new(&self.busy);
        let _in_flight = self.health.start();
        // Held until a run slot is free. It goes back to waiting for any worker (no retry spent)
        // when it has waited `hold_limit` (the runs here take longer than expected, and another
        // worker may start it at once), when the worker stops, and when the channel it came on
        // is lost (the broker returns the message to the queue, where it would expire and fail
        // the execution unstarted). A dispatch that must wait for a run slot is checked for
        // staleness on the way (`wait_for_slot`).
        let immediate = self.run_slots.try_acquire().ok();
        // held (marked with each heartbeat) until its claim has answered
        let held = Held::new(&self.held, execution_id);
        let mut held_too_long = false;
        let permit = match immediate {
            Some(permit) => Some(permit),
            None => tokio::select! {
                permit = self.wait_for_slot(execution_id) => match permit {
                    Some(permit) => Some(permit),
                    None => return Disposition::Ack,
                },
                _ = tokio::time::sleep(self.hold_limit()) => {
                    held_too_long = true;
                    None
                }
                _ = shutdown.cancelled() => None,
                _ = incoming.channel_lost.cancelled() => None,
            },
        };
        if incoming.channel_lost.is_cancelled() && permit.is_none() {
            // (the message's redelivery, if it comes, finds the execution no longer here)
            self.give_back_held(execution_id, "its channel was lost").await;
            return Disposition::Retry;
        }
        if held_too_long {
            self.give_back_held(execution_id, "every run slot is still taken").await;
            return Disposition::Ack;
        }
        if incoming.channel_lost.is_cancelled() {
            return Disposition::Retry;
        }
        let Some(permit) = permit.filter(|_| !shutdown.is_cancelled()) else {
            if self.displaced.load(std::sync::atomic::Ordering::SeqCst) {
                // back to the queue, for the new holder of the name
                return Disposition::Retry;
            }
            return self.hand_back(execution_id).await;
        };
        if self.lease.expired() {
            // the executors may take this worker for dead any moment: the dispatch waits for
            // another (or for this one once its heartbeats land again)
            self.give_back_held(execution_id, "no heartbeat has landed within the lease").await;
            return Disposition::Ack;
        }
        // one claim per execution in this process at a time: a second delivery of the same one
        // waits for nothing (so a claim read back after a lost acknowledgement is this one's)
        if !self.running.lock().expect("running map poisoned").reserve(execution_id) {
            tracing::debug!(execution_id, "dispatch is a duplicate of one claimed or running here");
            return Disposition::Ack;
        }
        // the claim reads what to run from the database: nothing of the message but the ids is
        // believed (a forged dispatch for an execution not scheduled here claims nothing)
        let run_token = new_run_token();
        let lapses = self.lease.lapses();
        let claimed = self.writes.claim(execution_id, &run_token).await;
        drop(held);
        if !matches!(claimed, Ok(Some(_))) {
            self.running.lock().expect("running map poisoned").release(execution_id);
        }
        let claimed = match claimed {
            Ok(Some(claimed)) => claimed,
            Ok(None) => {
                tracing::debug!(execution_id, "dispatch is stale or a duplicate");
                return Disposition::Ack;
            }
            Err(e) => {
                tracing::warn!(execution_id, error = %e, "could not claim execution");
                return Disposition::Retry;
            }
        };
        if self.lease.lapses() != lapses || self.lease.expired() {
            // The claim's answer came after the lease ran out: the executors may have taken
            // this worker for dead meanwhile and started the execution elsewhere. It does not run
            // here (its failure is reported, and is stale if it was).
            self.running.lock().expect("running map poisoned").release(execution_id);
            let result = failure_result(
                execution_id,
                self.id,
                Some(run_token),
                FailureKind::WorkerHeartbeatStale,
                "the worker's lease on its runs ran out while it claimed the execution: not started".into(),
            );
            self.report(&result).await;
            return Disposition::Ack;
        }
        let started = Instant::now();
        let (cancel, kill) = (self.abort.child_token(), CancellationToken::new());
        let runtime = claimed.runtime.as_deref().unwrap_or_default();
        let transient_exit_codes = transient_exit_codes(claimed.retry_policy.as_ref());
        let timeout_seconds = claimed.timeout_seconds.unwrap_or(self.settings.common.default_timeout_secs);
        // secrets referred to or sealed among the parameters, opened for this run alone; every
        // value opened is redacted from what the run produced before it is recorded
        let opened = attune_common::secrets::open(
            &self.db,
            self.settings.sealer.as_ref(),
            &claimed.action_ref,
            &claimed.parameters,
        )
        .await;
        let (parameters, redactor, unopened) = match opened {
            Ok(opened) => (opened.parameters, opened.redactor, None),
            Err(error) => (claimed.parameters.clone(), Default::default(), Some(error)),
        };
        let run = ActionRun {
            execution_id,
            action_ref: &claimed.action_ref,
            runtime,
            pack_path: PathBuf::from(claimed.pack_path.as_deref().unwrap_or_default()),
            entrypoint: claimed.entrypoint.as_deref().unwrap_or_default(),
            parameters: &parameters,
            timeout: Duration::from_secs(timeout_seconds.max(1) as u64),
            retry_count: claimed.retry_count,
            output_limit: self.settings.output_limit,
            transient_exit_codes: &transient_exit_codes,
            http: claimed.http.as_ref(),
            idempotency_key: &claimed.idempotency_key,
            limits: claimed.limits.as_ref(),
            kill: Some(&kill),
        };
        self.running.lock().expect("running map poisoned").start(execution_id, &cancel, &kill);
        // (an action removed since it was dispatched: nothing to run, and not this worker's fault)
        let action_gone = claimed.runtime.is_none();
        let mut ran = match (action_gone, unopened) {
            (true, _) => Ran::of(runner::Outcome {
                status: ResultStatus::Failed,
                failure_kind: Some(FailureKind::ActionNotFound),
                error: Some(format!("action '{}' no longer exists", claimed.action_ref)),
                result: None,
            }),
            (false, Some(error)) => Ran::of(runner::Outcome {
                status: ResultStatus::Failed,
                failure_kind: Some(FailureKind::InvalidParameters),
                error: Some(error),
                result: None,
            }),
            (false, None) => self.runtimes.execute(&run, &cancel).await,
        };
        if !redactor.is_empty() {
            ran.stdout = redactor.text(&ran.stdout);
            ran.stderr = redactor.text(&ran.stderr);
            ran.outcome.error = ran.outcome.error.map(|error| redactor.text(&error));
            if let Some(result) = ran.outcome.result.as_mut() {
                redactor.json(result);
            }
        }
        self.running.lock().expect("running map poisoned").end(execution_id);
        // the slot is for running an action: the next one may start while this one is recorded
        drop(permit);
        if self.lease_lost.lock().expect("lease poisoned").remove(&execution_id) {
            let lease = self.settings.lease().as_secs_f64();
            let result = failure_result(
                execution_id,
                self.id,
                Some(run_token),
                FailureKind::WorkerHeartbeatStale,
                format!(
                    "the worker's heartbeats did not land for {lease:.1} s (its lease): the run was stopped so that it can run elsewhere"
                ),
            );
            self.report(&result).await;
            return Disposition::Ack;
        }
        if cancel.is_cancelled() && !self.abort.is_cancelled() {
            // A client canceled it (or an operator failed it): the record already says so.
            let stopped = match runtime {
                "http" => "stopped while running (canceled or failed by hand); request aborted",
                _ => "stopped while running (canceled or failed by hand); process group killed",
            };
            tracing::info!(execution_id, "{stopped}");
            return Disposition::Ack;
        }
        let outcome = ran.outcome;
        let duration_ms = started.elapsed().as_millis() as u64;
        let worker_failed = outcome.failure_kind.is_some_and(FailureKind::counts_against_worker) && !action_gone;
        let after = self.health.finish(worker_failed, duration_ms);
        // executors dispatch by the slots and the health of the last heartbeat: a change of either
        // is sent early
        self.reported.send_if_modified(|reported| {
            let now = (self.lookahead_now(), after.class, after.last_failure_at);
            std::mem::replace(reported, now) != now
        });
        let result = ExecutionResult {
            execution_id,
            worker_id: self.id,
            status: outcome.status,
            result: outcome.result,
            failure_kind: outcome.failure_kind,
            error: outcome.error,
            exit_code: ran.exit_code,
            stdout: ran.stdout,
            stderr: ran.stderr,
            duration_ms,
            http_status: ran.http_status,
            retry_after_ms: ran.retry_after.map(|after| after.as_millis() as u64),
            run_token: Some(run_token),
        };
        attune_common::metrics::increment(
            &attune_common::metrics::ACTIONS_RUN,
            &[("runtime", runtime), ("status", result.status.as_str())],
            1,
        );
        if result.status == ResultStatus::Completed && self.record_success(&result).await {
            return Disposition::Ack;
        }
        // (the row, if the database answers, and the message at once: neither waits for the other)
        tokio::join!(self.keep_report(&result), self.report(&result));
        Disposition::Ack
    }

    /// Records a success here, with the guarded transition an executor would use (running →
    /// completed, fenced by this worker): one message, one delivery and one executor round trip
    /// fewer per execution. Failures go to the executors as results, for the RetryManager.
    /// `false` (after logging) if the database refused the write, or did not take it within a
    /// quarter of the lease (cut off): the result then goes to the executors as well.
    async fn record_success(&self, result: &ExecutionResult) -> bool {
        let write = self.writes.record_success(result.execution_id, result.outcome(), result.run_token.clone());
        // A success that cannot be written soon (the database cut off) goes to the executors
        // too: they record it, before anyone may take this worker for dead and run the execution
        // again. Whichever write lands first records it; the other misses (the same guard).
        let patience = self.settings.lease() / 4;
        let Ok(recorded) = tokio::time::timeout(patience, write).await else {
            tracing::warn!(
                execution_id = result.execution_id,
                waited_ms = patience.as_millis() as u64,
                "the success could not be written yet; reporting it to the executors"
            );
            return false;
        };
        match recorded {
            Ok(true) => {
                result.observe_duration();
                tracing::info!(
                    execution_id = result.execution_id,
                    worker_id = self.id,
                    duration_ms = result.duration_ms,
                    "execution completed"
                );
                true
            }
            Ok(false) => {
                tracing::debug!(
                    execution_id = result.execution_id,
                    "execution no longer running here (canceled or taken over)"
                );
                true
            }
            Err(e) => {
                tracing::warn!(execution_id = result.execution_id, error = %e, "could not record the success; reporting it to the executors");
                false
            }
        }
    }

    /// A cancel notice: stop the execution if it runs (or is being claimed) here and the database
    /// says it no longer should. A notice is not believed by itself (anyone who can publish to the
    /// broker can send one); the API changes the row before it sends its own, so a genuine notice
    /// always finds the row changed. A notice for an execution not here needs no read: a claim of
    /// it after the change misses.
    async fn handle_control(&self, incoming: Incoming) -> Disposition {
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

    /// Keeps the report of a run in its row as well (`db::report`), so that the executors record
    /// it even if the broker delays the message (one try, bounded: the message still goes).
    async fn keep_report(&self, result: &ExecutionResult) {
        let Ok(report) = serde_json::to_value(result) else { return };
        let keep = db::report::keep(&self.db, result.execution_id, self.id, result.run_token.as_deref(), &report);
        match tokio::time::timeout(REPORT_WRITE_LIMIT, keep).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(execution_id = result.execution_id, error = %e, "could not keep the report in the row")
            }
            Err(_) => {
                tracing::debug!(execution_id = result.execution_id, "keeping the report in the row took too long")
            }
        }
    }

    /// Publishes a result, retrying until the broker confirms it: the execution is `running` in
    /// the database and only this message can finish it.
    async fn report(&self, result: &ExecutionResult) {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.publisher.publish(RESULT_KEY, result).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(execution_id = result.execution_id, error = %e, "could not report result, retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// What a heartbeat reports that executors schedule by: the look-ahead, the health class and the
/// last failure (a probe that failed must restart the probation at once).
type Reported = (u16, HealthClass, Option<chrono::DateTime<chrono::Utc>>);

/// The worker's lease on its runs (ADR 0008), on the boot clock (`supervise::boot_clock_ns`: it
/// counts while the machine sleeps, as the database's clock does).
struct Lease {
    /// When the last heartbeat that landed was sent.
    renewed: std::sync::Mutex<u128>,
    /// How many looks found it run out: a claim during which this changed must not start its run.
    lapses: std::sync::atomic::AtomicU64,
    length: Duration,
}

impl Lease {
    fn new(sent: u128, length: Duration) -> Lease {
        Lease { renewed: std::sync::Mutex::new(sent), lapses: Default::default(), length }
    }

    /// A heartbeat sent at `sent` landed; `true` if that renews the lease.
    fn renew(&self, sent: u128) -> bool {
        let mut renewed = self.renewed.lock().expect("lease poisoned");
        let newer = sent > *renewed;
        *renewed = (*renewed).max(sent);
        newer
    }

    /// How long since the last heartbeat that landed was sent.
    fn silent_for(&self) -> Duration {
        let renewed = *self.renewed.lock().expect("lease poisoned");
        let nanos = supervise::boot_clock_ns().saturating_sub(renewed);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Whether it has run out: no run may start.
    fn expired(&self) -> bool {
        self.silent_for() >= self.length
    }

    /// A look found it run out.
    fn lapsed(&self) {
        self.lapses.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn lapses(&self) -> u64 {
        self.lapses.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A dispatch in the held set (marked with each heartbeat) until dropped.
struct Held<'a>(&'a std::sync::Mutex<std::collections::HashSet<i64>>, i64);

impl<'a> Held<'a> {
    fn new(set: &'a std::sync::Mutex<std::collections::HashSet<i64>>, execution_id: i64) -> Self {
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
struct Busy<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Busy<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(count)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The executions running here and the cancel notices that came before their run started, under
/// one lock so that a notice racing the start of its execution is never lost.
#[derive(Default)]
struct Running {
    tokens: std::collections::HashMap<i64, CancellationToken>,
    canceled_early: std::collections::HashSet<i64>,
    /// Executions being claimed here (between `reserve` and `start` or `release`).
    claiming: std::collections::HashSet<i64>,
    /// When each running execution started.
    since: std::collections::HashMap<i64, Instant>,
    /// The token of each running execution that kills its process group at once.
    kills: std::collections::HashMap<i64, CancellationToken>,
}

impl Running {
    /// Reserves the claim of an execution for this delivery: `false` if it is being claimed or
    /// runs here already (a duplicate delivery).
    fn reserve(&mut self, execution_id: i64) -> bool {
        !self.tokens.contains_key(&execution_id) && self.claiming.insert(execution_id)
    }

    /// Gives up a reservation (the claim did not happen).
    fn release(&mut self, execution_id: i64) {
        self.claiming.remove(&execution_id);
    }

    /// Registers a starting execution; a notice that already came cancels it at once.
    fn start(&mut self, execution_id: i64, token: &CancellationToken, kill: &CancellationToken) {
        self.claiming.remove(&execution_id);
        if self.canceled_early.remove(&execution_id) {
            token.cancel();
        }
        self.tokens.insert(execution_id, token.clone());
        self.since.insert(execution_id, Instant::now());
        self.kills.insert(execution_id, kill.clone());
    }

    /// The execution's run has ended.
    fn end(&mut self, execution_id: i64) {
        self.tokens.remove(&execution_id);
        self.since.remove(&execution_id);
        self.kills.remove(&execution_id);
    }

    /// How long the youngest run has been going, when `slots` runs or more take every run slot:
    /// no dispatch held now can start before one of them ends. `None` while a slot is free.
    fn every_slot_busy_for(&self, slots: usize) -> Option<Duration> {
        if self.since.len() < slots.max(1) {
            return None;
        }
        self.since.values().map(Instant::elapsed).min()
    }

    /// Whether the execution is being claimed or runs here.
    fn is_here(&self, execution_id: i64) -> bool {
        self.tokens.contains_key(&execution_id) || self.claiming.contains(&execution_id)
    }

    /// Cancels a running execution (true), or remembers the notice for one about to start.
    fn cancel(&mut self, execution_id: i64) -> bool {
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

fn failure_result(
    execution_id: i64,
    worker_id: i64,
    run_token: Option<String>,
    kind: FailureKind,
    error: String,
) -> ExecutionResult {
    ExecutionResult {
        execution_id,
        worker_id,
        run_token,
        status: ResultStatus::Failed,
        result: None,
        failure_kind: Some(kind),
        error: Some(error),
        exit_code: None,
        stdout: String::new(),
        stderr: String::new(),
        duration_ms: 0,
        http_status: None,
        retry_after_ms: None,
    }
}

/// A run token (see `ExecutionResult::run_token`): 128 bits from the thread's generator (ChaCha,
/// seeded from the operating system), as 32 hex digits.
fn new_run_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The exit codes an action's stored `retry` block treats as transient (besides 75).
fn transient_exit_codes(retry_policy: Option<&serde_json::Value>) -> Vec<i32> {
    retry_policy
        .and_then(|policy| serde_json::from_value::<attune_common::pack::RetryPolicy>(policy.clone()).ok())
        .and_then(|policy| policy.exit_codes)
        .unwrap_or_default()
}

#[cfg(test)]
mod settings_tests {
    use super::*;
    use attune_common::config::Defaults;

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let s = Settings::from_source(&Defaults).unwrap();
        assert_eq!(s.runtimes, ["shell", "python", "builtin", "http"]);
        assert_eq!((s.concurrency, s.prefetch, s.output_limit), (4, 16, 65536));
        assert_eq!(
            (s.heartbeat_interval, s.queue_ttl, s.drain),
            (Duration::from_secs(10), Duration::from_secs(300), Duration::from_secs(30))
        );
        assert!(s.name.ends_with(&format!("-{}", std::process::id())), "host name and pid: {}", s.name);
        assert_eq!(s.health_override_file, None);
        assert_eq!(s.http_allow, AllowList::default(), "http actions reach global addresses only");
    }

    #[test]
    fn actions_run_as_their_own_users_by_default_as_root_and_only_as_root() {
        use attune_common::settings::Vars;
        let none = Vars(&[]);
        assert_eq!(action_uids(&none, true).unwrap(), Some(DEFAULT_ACTION_UIDS));
        assert_eq!(action_uids(&none, false).unwrap(), None, "a worker that is not root runs them as itself");
        let off = Vars(&[(ACTION_UIDS, "off")]);
        assert_eq!(action_uids(&off, true).unwrap(), None);
        let range = Vars(&[(ACTION_UIDS, "70000-70009")]);
        assert_eq!(action_uids(&range, true).unwrap(), Some(70000..=70009));
        assert_eq!(action_uids(&range, false).unwrap_err().name, ACTION_UIDS, "a range needs root");
        for bad in ["0-10", "10-5", "x", "5", "-5"] {
            let vars: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(ACTION_UIDS, bad)]));
            assert_eq!(action_uids(&Vars(vars), true).unwrap_err().name, ACTION_UIDS, "{bad}");
        }
    }

    #[test]
    fn the_http_allow_list_is_read_and_a_bad_entry_is_named() {
        use attune_common::settings::Vars;
        let allowed = Settings::from_source(&Vars(&[("ATTUNE_WORKER_HTTP_ALLOW", "127.0.0.1/32, ::1/128")])).unwrap();
        assert!(
            allowed.http_allow.admits("127.0.0.1".parse().unwrap())
                && allowed.http_allow.admits("::1".parse().unwrap())
        );
        assert!(!allowed.http_allow.admits("10.0.0.1".parse().unwrap()));
        let error =
            Settings::from_source(&Vars(&[("ATTUNE_WORKER_HTTP_ALLOW", "127.0.0.1/32,10.0.0.0/33")])).unwrap_err();
        assert!(
            error.to_string().starts_with("invalid value \"10.0.0.0/33\" for ATTUNE_WORKER_HTTP_ALLOW: "),
            "{error}"
        );
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
    fn run_tokens_are_128_random_bits_in_hex() {
        let (a, b) = (new_run_token(), new_run_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn transient_exit_codes_come_from_the_stored_retry_block() {
        assert_eq!(transient_exit_codes(Some(&json!({"exit_codes": [3, 4]}))), [3, 4]);
        assert!(transient_exit_codes(Some(&json!({"max_attempts": 2}))).is_empty());
        assert!(transient_exit_codes(None).is_empty());
    }
}
