//! The worker's life: claiming its name, starting its loops and consumers (`run`), recovering what
//! an earlier run of it left, draining on SIGTERM and leaving.

use std::sync::Arc;
use std::time::Duration;

use attune_common::config::ConfigError;
use attune_common::db;
use attune_common::mq::{ConsumerSpec, Publisher, RESULT_KEY, Topology, run_consumer};
use attune_core::FailureKind;
use attune_core::health::HealthClass;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::health::HealthState;
use crate::heartbeat::Lease;
use crate::heartbeat::{capabilities, this_instance};
use crate::record::failure_result;
use crate::runner::{self, Runtimes};
use crate::{Error, PREFETCH_MARGIN, Settings, Worker, fence, supervise, writes};

/// Makes this process non-dumpable, so an action running as the same (non-root) user cannot read
/// the worker's environment (`DATABASE_URL`, `AMQP_URL`) through `/proc/<pid>/environ` or attach a
/// debugger. Actions start with a clean environment either way; running them under a separate
/// user is the stronger separation.
#[allow(unsafe_code)]
pub(crate) fn protect_process() {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) only changes a flag of the calling process.
    let result = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if result != 0 {
        tracing::warn!("could not make the worker process non-dumpable");
    }
}

/// Whether a process of this host is alive (signal 0 probes without signalling).
#[allow(unsafe_code)]
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: kill(2) with signal 0 checks for the process's existence and has no effect.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Takes the worker's name for this process, or refuses to start while a live process holds it.
pub(crate) async fn claim_name(pool: &PgPool, settings: &Settings) -> Result<i64, Error> {
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

/// The runtimes of `ATTUNE_WORKER_RUNTIMES` this worker's login may serve (`worker_login_runtime`,
/// kept by the operator): its row may advertise no other, nor may it claim or open the secrets
/// of another's runs. One the login is not granted is left out, with a warning; none at all is
/// an error naming the login.
async fn granted(pool: &PgPool, settings: &Settings) -> Result<Vec<String>, Error> {
    let Some(granted) = db::worker::granted_runtimes(pool).await? else {
        return Ok(settings.runtimes.clone());
    };
    let (kept, refused): (Vec<String>, Vec<String>) =
        settings.runtimes.iter().cloned().partition(|runtime| granted.contains(runtime));
    if kept.is_empty() {
        return Err(Error::Config(ConfigError {
            name: "ATTUNE_WORKER_RUNTIMES".into(),
            value: settings.runtimes.join(","),
            reason: format!(
                "this worker's database login may serve none of them (granted: {}): the schema's owner grants them \
                 with `attune worker-login allow <login> <runtime>...`",
                if granted.is_empty() { "none".to_string() } else { granted.join(", ") }
            ),
        }));
    }
    if !refused.is_empty() {
        tracing::warn!(
            refused = ?refused,
            granted = ?granted,
            "runtimes this worker's database login is not granted are not offered (`attune worker-login allow`)"
        );
    }
    Ok(kept)
}

/// Runs a worker until `shutdown` fires.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), Error> {
    protect_process();
    let pool =
        db::connect_checking(&settings.common.database_url, 4, Duration::from_secs(60), db::Check::AfterIdle).await?;
    db::check_schema(&pool).await?;
    let wanted = granted(&pool, &settings).await?;
    let runtimes = Runtimes::detect(&wanted, settings.supervisor.clone(), settings.http_allow.clone())
        .await
        .packs_under(settings.common.packs_dir.clone())
        .as_users(settings.action_uids.clone().map(|range| runner::ActionUsers::new(range, settings.action_limits())));
    if let Some(reason) = runtimes.packs_closed() {
        return Err(Error::Config(ConfigError {
            name: "ATTUNE_PACKS_DIR".into(),
            value: settings.common.packs_dir.display().to_string(),
            reason,
        }));
    }
    let topology = Topology::new(&settings.common.mq_namespace, settings.queue_ttl);
    let publisher =
        Publisher::new(&settings.common.amqp_url, &format!("attune-worker-{}", settings.name), topology.clone());
    let health =
        HealthState::new(settings.health.clone(), settings.health_override_file.clone(), settings.health_window_secs);
    let previous_queue = db::worker::queue_of(&pool, &settings.name).await?;
    let fence_key = db::fence::key(&pool).await?;
    match db::worker::health_config(&pool).await.map(|c| c["heartbeat_max_age_secs"].as_i64()) {
        // (the executors store theirs when they start: on a deployment starting all at once the row
        // may still hold the default; the executors' notices say it for sure, `fence`)
        Ok(Some(stored)) if stored != settings.health.heartbeat_max_age_secs => tracing::warn!(
            executors = stored,
            worker = settings.health.heartbeat_max_age_secs,
            "ATTUNE_HEARTBEAT_MAX_AGE_SECS differs from the one the executors last stored: set it alike everywhere \
             (the worker keeps its lease inside the executors' limit once it hears from them)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the executors' heartbeat limit"),
    }
    let worker_id = claim_name(&pool, &settings).await?;
    // before it can run anything: followers believe live output only from this user
    db::worker::record_broker_user(&pool, worker_id, &publisher.broker_user()).await?;
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
        reported: tokio::sync::watch::Sender::new((settings.lookahead(None), HealthClass::Healthy, None, None)),
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
        notices: fence::Notices::new(Some(fence_key), settings.health.heartbeat_max_age()),
        lease_lost: Default::default(),
        live: Default::default(),
    });
    if settings.supervisor.is_some() {
        // the supervisors of its actions kill them once the lease's deadline passes (ADR 0008):
        // the long-lived one is told each deadline over its socket, a per-action fallback reads
        // it from a file in a directory of this process's own
        let written = supervise::private_lease_dir(&std::env::temp_dir(), worker_id).and_then(|dir| {
            let path = dir.join("lease");
            supervise::write_lease(&path, worker.lease.deadline()).map(|()| path)
        });
        match written {
            Ok(path) => supervise::set_lease_file(path),
            Err(e) => tracing::warn!(
                dir = %std::env::temp_dir().display(),
                error = %e,
                "no lease file: an action started by a per-action fallback supervisor runs on if this worker stalls (the long-lived supervisor is told the lease directly)"
            ),
        }
        worker.tell_lease();
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
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
    if let Err(e) = db::worker::deactivate(&worker.db, worker_id).await {
        tracing::warn!(error = %e, "could not mark the worker inactive");
    }
    tracing::info!(worker_id, "worker stopped");
    Ok(())
}

impl Worker {
    /// Hands back every execution dispatched to this worker that has not started.
    pub(crate) async fn hand_back_unstarted(&self) {
        match db::retry_while_unavailable("reading unstarted dispatches", || {
            db::execution::worker::scheduled_on(&self.db, self.id)
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
    pub(crate) async fn recover_previous_run(&self) -> Result<(), Error> {
        self.hand_back_unstarted().await;
        // what an earlier process of this worker ran is gone with its supervisor: the slots of
        // the runs ended by hand are free
        crate::run::release(&self.db, None, self.id).await;
        // (each result carries the token the earlier process drew: the executor records only that)
        let orphans = db::execution::worker::runs_on(&self.db, self.id).await?;
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

    /// On a shutdown request: stop receiving new work, hand back what has not started, let what
    /// runs finish, then stop the consumers once the queue is empty (see the module's
    /// documentation).
    pub(crate) async fn drain_when_asked(
        self: Arc<Self>,
        shutdown: CancellationToken,
        stop_consuming: CancellationToken,
    ) {
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
    pub(crate) async fn remove_queue(&self) {
        match self.publisher.retire_worker_queue(&self.queue, self.id).await {
            Ok(true) => tracing::info!(queue = %self.queue, "worker queue deleted"),
            Ok(false) => tracing::warn!(queue = %self.queue, "worker queue not empty; left to expire"),
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "could not delete the worker queue; left to expire")
            }
        }
    }
}
