//! Scheduling: waiting requests become dispatches to workers with a free slot.
//!
//! A request waits as its `requested` row (docs/adr/0001-requests-wait-as-rows.md). PostgreSQL
//! announces new ones to every executor at the commit that makes them visible
//! (`db::announcements`, docs/adr/0005-requests-announced-by-the-database.md; `listen`); an
//! `execution.request` message (a worker's hand-back) is only a hint, acknowledged at once, so
//! nothing is held unacknowledged while it waits. A missed announcement or a lost hint costs at
//! most one `SWEEP` of delay. One loop per executor (`run`) looks at the runtimes with waiting work:
//! for each, it plans as many placements as the workers offering it have free slots
//! (`selection::plan`: healthy by queue depth, then degraded, never unhealthy; a worker that holds
//! work ahead is topped up once half its look-ahead is free, docs/adr/0010) and claims that
//! many of the oldest waiting rows in one statement (`db::execution::scheduler::claim_waiting`). Then it
//! publishes their dispatches. A runtime with no room costs nothing per waiting request: a new
//! request for it brings no room and is no reason to look; the loop looks again when the workers'
//! recent execution times say room may have come free (at least `ATTUNE_INFLIGHT_CACHE_MS` later,
//! at most `FULL_WAIT_MAX`: one read of the in-flight counts a look, see `full_wait`), and
//! whenever this executor records a finished execution.
//!
//! A request fails, as the retriable `worker_unavailable`, only when no worker that could take
//! work has offered its runtime for `ATTUNE_WORKER_WAIT_SECS`: the wait counts from when the last
//! one left (a draining worker, finishing its runs or restarting, has not left), or from the
//! request's creation if later. A dispatch that cannot be
//! published is tried again with backoff and, failing that, goes back to waiting
//! (scheduled → requested, fenced by the worker): transport trouble never spends a retry.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attune_common::db::{
    self, execution::Execution, execution::Outcome, execution::Patience, execution::scheduler::Claimed,
};
use attune_common::metrics;
use attune_common::mq::{
    DELIVERY_LIMIT, Dispatch, Disposition, ExecutionRequest, Incoming, MOST_PER_DISPATCH, MqError, Topology,
};
use attune_common::trace;
use attune_core::{ExecutionStatus, FailureKind, selection};
use tokio_util::sync::CancellationToken;

use crate::Context;
use crate::health_probe::Picture;

/// Every runtime with waiting work is looked at at least this often, hint or not.
const SWEEP: Duration = Duration::from_secs(1);
/// Most executions claimed for one runtime in one statement.
const BATCH: usize = 256;
/// How long a runtime that no worker offers is left before it is looked at again.
const NO_WORKER_RECHECK: Duration = Duration::from_millis(250);
/// The longest a runtime whose workers are all full waits for its next look (see `full_wait`).
const FULL_WAIT_MAX: Duration = Duration::from_millis(250);
/// How long a dispatch is tried before its execution goes back to waiting.
const DISPATCH_PATIENCE: Duration = Duration::from_secs(5);

/// The runtimes that may have waiting work, marked by hints and by this executor's own events,
/// and the wake-up of the loop.
#[derive(Default)]
pub struct Waiting {
    marked: Mutex<Marked>,
    wake: tokio::sync::Notify,
}

/// What the next look is to cover.
#[derive(Debug, Default)]
pub struct Marked {
    pub runtimes: BTreeSet<String>,
    /// A hint without a known runtime: look at every runtime with waiting work.
    pub all: bool,
    /// Room may have come free: a runtime whose workers were full is looked at again now.
    pub room: bool,
}

impl Waiting {
    /// `runtime` may have new waiting work.
    pub fn mark(&self, runtime: &str) {
        let mut marked = self.marked.lock().expect("waiting marks poisoned");
        if !marked.runtimes.contains(runtime) {
            marked.runtimes.insert(runtime.to_string());
        }
        drop(marked);
        self.wake.notify_one();
    }

    /// Some runtime may have new waiting work.
    pub fn mark_all(&self) {
        self.marked.lock().expect("waiting marks poisoned").all = true;
        self.wake.notify_one();
    }

    /// Room may have come free (this executor recorded a finished execution).
    pub fn wake(&self) {
        self.marked.lock().expect("waiting marks poisoned").room = true;
        self.wake.notify_one();
    }

    /// The marks so far, cleared (what a look takes).
    pub fn take(&self) -> Marked {
        std::mem::take(&mut *self.marked.lock().expect("waiting marks poisoned"))
    }
}

/// An execution request message: a hint that its runtime has waiting work (sent by a worker that
/// hands a dispatch back, and by the API of versions before the database announced requests).
/// Acknowledged at once; the row is the request.
pub async fn handle(context: &Context, incoming: Incoming) -> Disposition {
    let request: ExecutionRequest = match incoming.parse("execution request") {
        Ok(request) => request,
        Err(disposition) => return disposition,
    };
    let action = match request.action_id {
        Some(action_id) => context.actions.get(&context.db, action_id).await.ok().flatten(),
        None => None,
    };
    match action {
        Some(action) => context.waiting.mark(&action.runtime),
        None => context.waiting.mark_all(),
    }
    Disposition::Ack
}

/// Marks the runtimes PostgreSQL announces new requests for, until `shutdown` fires. While the
/// connection is down (and when it is back) every runtime is marked: announcements sent meanwhile
/// are lost, and the loop's sweep finds their rows.
pub async fn listen(
    database_url: &str,
    waiting: &Waiting,
    workflows: &crate::workflows::Marks,
    shutdown: CancellationToken,
) {
    use db::announcements::{Announced, Announcements};
    let mut backoff = Duration::from_millis(100);
    let mut lost = false;
    loop {
        let listening = tokio::select! {
            _ = shutdown.cancelled() => return,
            listening = Announcements::listen(database_url) => listening,
        };
        let error = match listening {
            Ok(mut announcements) => {
                // rows committed before the subscription were not announced to it
                waiting.mark_all();
                workflows.all();
                backoff = Duration::from_millis(100);
                if std::mem::take(&mut lost) {
                    tracing::info!("listening for new requests again");
                }
                loop {
                    let next = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        next = announcements.next() => next,
                    };
                    match next {
                        Ok(Announced::Runtimes(runtimes)) => {
                            for runtime in &runtimes {
                                waiting.mark(runtime);
                            }
                        }
                        Ok(Announced::Workflow(run)) => workflows.run(run),
                        // (an executor does not listen for those: the API answers them)
                        Ok(Announced::Event(_)) => {}
                        Ok(Announced::Some) => waiting.mark_all(),
                        Ok(Announced::Missed) => {
                            waiting.mark_all();
                            workflows.all();
                        }
                        Err(e) => break e,
                    }
                }
            }
            Err(e) => e,
        };
        lost = true;
        tracing::warn!(error = %error, retry_in_ms = backoff.as_millis() as u64, "not listening for new requests; the once-a-second sweep finds them meanwhile");
        waiting.mark_all();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// What the loop remembers between looks.
struct Loop {
    last_sweep: Option<Instant>,
    /// When an active worker that could take work last offered each runtime.
    offered: HashMap<String, Instant>,
    started: Instant,
    /// Runtimes to look at again, and when.
    again: HashMap<String, Instant>,
    /// Runtimes whose workers were all full at their last look, with the wait chosen then: a
    /// new request for one is no reason to look before its time in `again` (it brings no room).
    full: HashMap<String, Duration>,
    /// Taken in turn, so that one runtime's backlog does not always go first.
    turn: usize,
    /// Executions whose claim the database refused, and how many times.
    refused: HashMap<i64, i64>,
    /// The last look's picture, with its claims added (see `look`).
    picture: Option<Picture>,
}

/// The longest one look may take (a look takes milliseconds when all is well).
const LOOK_LIMIT: Duration = Duration::from_secs(30);

/// The scheduling loop, until `shutdown` fires.
pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    let mut state = Loop {
        last_sweep: None,
        offered: HashMap::new(),
        started: Instant::now(),
        again: HashMap::new(),
        full: HashMap::new(),
        turn: 0,
        refused: HashMap::new(),
        picture: None,
    };
    let mut backoff = Duration::from_millis(100);
    loop {
        let next = state.again.values().min().copied();
        let sweep_at = state.last_sweep.map_or_else(Instant::now, |at| at + SWEEP);
        let until = next.map_or(sweep_at, |n| n.min(sweep_at));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = context.waiting.wake.notified() => {}
            _ = tokio::time::sleep_until(until.into()) => {}
        }
        // (bounded: a statement on a connection gone silent, without a reset, would hold every
        // runtime's scheduling for the kernel's fifteen minutes of retransmissions; a claim made
        // by a look cut short is found by the monitor as a lost dispatch)
        let looked = tokio::time::timeout(LOOK_LIMIT, look(&context, &mut state))
            .await
            .unwrap_or(Err(crate::Error::Database(sqlx::Error::PoolTimedOut)));
        match looked {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "scheduling pass failed");
                context.waiting.mark_all();
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// One look at every runtime that may have waiting work.
async fn look(context: &Arc<Context>, state: &mut Loop) -> Result<(), crate::Error> {
    let now = Instant::now();
    let marked = context.waiting.take();
    let mut runtimes = marked.runtimes;
    if marked.room {
        for runtime in std::mem::take(&mut state.full).into_keys() {
            state.again.insert(runtime, now);
        }
    }
    let due: Vec<String> = state.again.iter().filter(|(_, at)| **at <= now).map(|(r, _)| r.clone()).collect();
    // the waits of the full runtimes due now, for their next (`full_wait`)
    let mut waited = HashMap::new();
    for runtime in due {
        state.again.remove(&runtime);
        if let Some(wait) = state.full.remove(&runtime) {
            waited.insert(runtime.clone(), wait);
        }
        runtimes.insert(runtime);
    }
    if marked.all || state.last_sweep.is_none_or(|at| now.duration_since(at) >= SWEEP) {
        state.last_sweep = Some(now);
        runtimes.extend(db::execution::scheduler::waiting_runtimes(&context.db).await?);
        for execution in db::execution::scheduler::waiting_without_runtime(&context.db, BATCH as i64).await? {
            let reason = format!("action '{}' did not exist when it was submitted", execution.action_ref);
            fail(context, &execution, FailureKind::ActionNotFound, reason).await?;
        }
        if db::worker::any_keyless(&context.db).await? {
            for runtime in runtimes.iter().filter(|r| *r != attune_core::workflow::RUNTIME) {
                fail_without_key(context, runtime).await?;
            }
        }
    }
    // no worker runs a workflow: its runs are the workflow engine's to start
    if runtimes.remove(attune_core::workflow::RUNTIME) {
        context.workflows.waiting();
    }
    // (a runtime whose workers were full is looked at when its wait is over, or room came free)
    runtimes.retain(|runtime| !state.full.contains_key(runtime));
    if runtimes.is_empty() {
        return Ok(());
    }
    // no claim while dispatches could not be sent: the requests wait where they are
    if let Err(e) = context.publisher.ping().await {
        // nobody can be judged unavailable while the broker is away: the wait starts afresh
        for runtime in runtimes {
            state.offered.insert(runtime.clone(), now);
            state.again.insert(runtime, now + NO_WORKER_RECHECK);
        }
        return Err(e.into());
    }
    let config = context.health_probe.config().clone();
    let heartbeat_max_age = Duration::from_secs(context.settings.health.heartbeat_max_age_secs.max(0) as u64);
    let runtimes: Vec<String> = runtimes.into_iter().collect();
    // The in-flight counts of a read younger than `ATTUNE_INFLIGHT_CACHE_MS`, with this
    // executor's claims since added, are used again: at a steady rate every hint would otherwise
    // wait for a read of its own before its claim. Such a picture can only overstate what is in
    // flight (completions since are missing), so a runtime it shows without room is looked at
    // with a fresh read.
    let mut picture = match state.picture.take() {
        Some(picture)
            if picture.age() < context.settings.inflight_cache
                && runtimes.iter().all(|runtime| free_slots(&picture.rooms(&config, runtime)) > 0) =>
        {
            picture
        }
        _ => context.health_probe.picture().await?,
    };
    state.turn = state.turn.wrapping_add(1);
    let start = state.turn % runtimes.len();
    for runtime in runtimes[start..].iter().chain(&runtimes[..start]) {
        if picture.could_run(&config, runtime) {
            state.offered.insert(runtime.clone(), now);
        }
        let rooms = picture.rooms(&config, runtime);
        let free = free_slots(&rooms);
        let limit = free.clamp(0, BATCH as i64) as usize;
        let plan = selection::plan(&config, rooms, limit, picture.now(), |_| rand::random());
        if plan.is_empty() {
            let could_run = picture.could_run(&config, runtime);
            // a draining worker finishes its runs and may be restarting: the wait for a worker
            // starts when the last one that offered the runtime is gone
            if !could_run && db::worker::draining_offers(&context.db, runtime, heartbeat_max_age).await? {
                state.offered.insert(runtime.clone(), now);
            }
            let offered = state.offered.get(runtime).copied().unwrap_or(state.started);
            if could_run {
                // every worker is busy: look again when room may have come free
                let wait = full_wait(
                    picture.room_expected_in(runtime),
                    waited.get(runtime).copied(),
                    context.settings.inflight_cache,
                );
                state.full.insert(runtime.clone(), wait);
                state.again.insert(runtime.clone(), now + wait);
            } else if now.duration_since(offered) >= context.settings.worker_wait {
                let failed = fail_unplaceable(context, runtime).await?;
                let recheck = if failed == BATCH { now } else { now + NO_WORKER_RECHECK };
                state.again.insert(runtime.clone(), recheck);
            } else {
                state.again.insert(runtime.clone(), now + NO_WORKER_RECHECK);
            }
            continue;
        }
        let since = picture.db_read_at();
        let claimed =
            match db::execution::scheduler::claim_waiting(&context.db, runtime, &plan, since, Patience::Surely).await {
                Ok(claimed) => claimed,
                Err(e) if db::is_transient(&e) => return Err(e.into()),
                // the database refused the batch: claim one by one, to find the row it refuses
                Err(e) => {
                    tracing::warn!(runtime = %runtime, error = %e, "batch claim refused; claiming one at a time");
                    claim_one_by_one(context, state, runtime, &plan).await?
                }
            };
        for execution in &claimed {
            picture.add(execution.worker, 1);
        }
        if claimed.len() == plan.len() {
            // More may be waiting. With room left (the batch's limit), look again at once; with
            // the room used up, when some may have come free. (A look at once found the room of
            // a run or two, and claimed, published and delivered them alone: core.echo at its
            // maximum rate, 4.5 executions per claim, 772/s and 1.36 ms of platform CPU per
            // execution; 7.1, 822 to 849/s and 1.15 to 1.20 ms with a wait.)
            if (limit as i64) < free {
                state.again.insert(runtime.clone(), now);
            } else {
                // (full now: a request meanwhile brings no room, as `full` says)
                state.full.insert(runtime.clone(), context.settings.inflight_cache);
                state.again.insert(runtime.clone(), now + context.settings.inflight_cache);
            }
        }
        // one message per worker for what this claim placed on it
        let mut by_worker: HashMap<i64, Vec<Claimed>> = HashMap::new();
        for execution in claimed {
            by_worker.entry(execution.worker).or_default().push(execution);
        }
        for (_, group) in by_worker {
            let task = context.clone();
            context.dispatches.spawn(async move { dispatch(&task, group).await });
        }
    }
    state.picture = Some(picture);
    Ok(())
}

/// How long a runtime whose workers are all full waits for its next look. Each look reads the
/// in-flight counts, and only the end of runs makes room: a look every `ATTUNE_INFLIGHT_CACHE_MS`
/// cost a read every 10 ms for as long as the workers stayed full, whatever the length of their
/// runs. So it waits half the time the workers' recent execution times give for the first of
/// them to have room (`Picture::room_expected_in`); without those, twice its last wait. Never
/// less than `ATTUNE_INFLIGHT_CACHE_MS`, nor more than `FULL_WAIT_MAX`. Half, so that a judgement
/// off by up to twice still looks before the room it expects; a worker topped up late still
/// holds half its look-ahead meanwhile.
fn full_wait(expected: Option<Duration>, last: Option<Duration>, least: Duration) -> Duration {
    let wait = match expected {
        Some(expected) => expected / 2,
        None => last.map_or(least, |last| last * 2),
    };
    wait.clamp(least, FULL_WAIT_MAX.max(least))
}

/// The free slots of these rooms together.
fn free_slots(rooms: &[selection::Room]) -> i64 {
    rooms.iter().fold(0i64, |sum, room| sum.saturating_add(room.free))
}

/// The claim of `plan.len()` waiting executions one at a time (but those of actions with a
/// concurrency policy), after the database refused the batch (a bug or a constraint on one row):
/// the others go on, and an execution whose claim is refused `DELIVERY_LIMIT` times fails as `poison_message` (not retried), as a message that
/// keeps failing would be dead-lettered.
async fn claim_one_by_one(
    context: &Context,
    state: &mut Loop,
    runtime: &str,
    plan: &[i64],
) -> Result<Vec<Claimed>, crate::Error> {
    use attune_common::db::execution::Transition;
    let waiting = db::execution::scheduler::waiting_unlimited(&context.db, runtime, plan.len() as i64).await?;
    let mut claimed = Vec::new();
    // a worker without the secrets key takes only a run whose parameters need none, as in the claim
    let keyless = db::worker::keyless_among(&context.db, plan).await?;
    let mut slots: Vec<i64> = plan.to_vec();
    for execution in waiting {
        let needs_key = attune_common::secrets::needs_key(&execution.parameters);
        let Some(slot) = slots.iter().position(|worker| !needs_key || !keyless.contains(worker)) else { continue };
        let worker_id = slots.remove(slot);
        let assign =
            Transition::to(ExecutionStatus::Scheduled).from(&[ExecutionStatus::Requested]).assign_worker(worker_id);
        match db::execution::transition(&context.db, execution.id, &assign).await {
            Ok(Some(row)) => claimed.push(Claimed {
                id: row.id,
                worker: worker_id,
                action: row.action,
                action_ref: row.action_ref,
                parameters: row.parameters,
                timeout_seconds: row.timeout_seconds,
                retry_count: row.retry_count,
                not_before: row.not_before,
                created: row.created,
                idempotency_key: row.idempotency_key,
                trace_parent: row.trace_parent,
            }),
            Ok(None) => {}
            Err(e) if db::is_transient(&e) => return Err(e.into()),
            Err(e) => {
                let refusals = state.refused.entry(execution.id).or_default();
                *refusals += 1;
                tracing::warn!(execution_id = execution.id, refusals = *refusals, error = %e, "the database refused to schedule this execution");
                if *refusals >= DELIVERY_LIMIT {
                    state.refused.remove(&execution.id);
                    metrics::increment(&metrics::POISON_MESSAGES, &[], 1);
                    let reason = format!("its scheduling write failed {DELIVERY_LIMIT} times: {e}");
                    fail(context, &execution, FailureKind::PoisonMessage, reason).await?;
                }
            }
        }
    }
    if state.refused.len() > 10_000 {
        state.refused.clear();
    }
    Ok(claimed)
}

/// Fails the requests for `runtime` that no worker could take for `ATTUNE_WORKER_WAIT_SECS`, as
/// `worker_unavailable` (retriable). Returns how many.
async fn fail_unplaceable(context: &Context, runtime: &str) -> Result<usize, crate::Error> {
    let wait = context.settings.worker_wait;
    let stranded =
        db::execution::scheduler::waiting_longer_than(&context.db, runtime, wait.as_secs_f64(), BATCH as i64).await?;
    for execution in &stranded {
        metrics::increment(&metrics::WORKER_UNAVAILABLE, &[("runtime", runtime)], 1);
        let reason = format!("no healthy or degraded active worker offered runtime '{runtime}' for {wait:?}");
        fail(context, execution, FailureKind::WorkerUnavailable, reason).await?;
    }
    Ok(stranded.len())
}

/// Fails the requests for `runtime` whose parameters need the secrets key and that waited
/// `ATTUNE_WORKER_WAIT_SECS` while only workers without the key offer it, as `worker_unavailable`
/// (retriable): a worker without `ATTUNE_SECRETS_KEY_FILE` is given no such run.
async fn fail_without_key(context: &Context, runtime: &str) -> Result<usize, crate::Error> {
    let wait = context.settings.worker_wait;
    let max_age = context.settings.health.heartbeat_max_age_secs.max(0) as f64;
    let stranded = db::execution::scheduler::waiting_for_key_longer_than(
        &context.db,
        runtime,
        wait.as_secs_f64(),
        max_age,
        BATCH as i64,
    )
    .await?;
    for execution in &stranded {
        metrics::increment(&metrics::WORKER_UNAVAILABLE, &[("runtime", runtime)], 1);
        let reason = format!(
            "its parameters hold secrets, and no worker with ATTUNE_SECRETS_KEY_FILE offered runtime '{runtime}' for {wait:?}"
        );
        fail(context, execution, FailureKind::WorkerUnavailable, reason).await?;
    }
    Ok(stranded.len())
}

/// Publishes the dispatch of executions claimed for one worker, in one message (one per
/// `MOST_PER_DISPATCH`): their ids and the worker's, nothing of what to run (the worker reads
/// that in its claim). An execution whose action is gone fails here as `action_not_found`. A
/// publish that fails is tried again with backoff for `DISPATCH_PATIENCE` (at once given up if
/// the worker's queue is gone); then the executions go back to waiting, with no retry spent.
async fn dispatch(context: &Context, claimed: Vec<Claimed>) {
    let Some(worker_id) = claimed.first().map(|c| c.worker) else { return };
    // each execution's `schedule` span (when traces are on): from its claim for this worker to
    // the end of its dispatch
    let mut scheduling: HashMap<i64, trace::Span> = HashMap::new();
    if trace::on() {
        for execution in &claimed {
            let parent = execution.trace_parent.as_deref();
            let mut span = trace::span("schedule", trace::Kind::Internal, Some(execution.id), parent);
            span.attribute("attune.worker_id", worker_id);
            span.attribute("attune.retry_count", i64::from(execution.retry_count));
            scheduling.insert(execution.id, span);
        }
    }
    // each with its action's runtime
    let mut sent: Vec<(Claimed, String)> = Vec::with_capacity(claimed.len());
    for execution in claimed {
        let action = match execution.action {
            Some(action_id) => {
                db::retry_while_unavailable("reading an action", || context.actions.get(&context.db, action_id)).await
            }
            None => Ok(None),
        };
        match action {
            Ok(Some(action)) => sent.push((execution, action.runtime.clone())),
            Ok(None) => {
                let reason = format!("action '{}' no longer exists", execution.action_ref);
                if let Err(e) = fail_claimed(context, &execution, FailureKind::ActionNotFound, reason).await {
                    tracing::warn!(execution_id = execution.id, error = %e, "could not fail an execution whose action is gone");
                }
            }
            Err(e) => {
                tracing::warn!(execution_id = execution.id, error = %e, "could not read the action; the execution waits again");
                give_back(context, &execution, None).await;
            }
        }
    }
    for part in sent.chunks(MOST_PER_DISPATCH) {
        publish_dispatch(context, worker_id, part, &scheduling).await;
    }
}

/// Publishes one dispatch message for `sent` (claimed for `worker_id`, each with its action's
/// runtime); gives them all back if it cannot.
async fn publish_dispatch(
    context: &Context,
    worker_id: i64,
    sent: &[(Claimed, String)],
    scheduling: &HashMap<i64, trace::Span>,
) {
    // the ids only: the worker reads what to run from the database when it claims the execution
    let ids: Vec<i64> = sent.iter().map(|(c, _)| c.id).collect();
    let Some(mut message) = Dispatch::of(worker_id, &ids) else { return };
    // each execution's `dispatch` span (a producer's, under its `schedule` span), whose context
    // the message carries to the worker's `run` span
    let dispatching: Vec<trace::Span> = ids
        .iter()
        .filter_map(|id| {
            let parent = scheduling.get(id)?.traceparent()?;
            let mut span = trace::span("dispatch", trace::Kind::Producer, Some(*id), Some(&parent));
            span.attribute("messaging.destination.name", Topology::worker_key(worker_id));
            message.traces.push((*id, span.traceparent()?));
            Some(span)
        })
        .collect();
    let started = Instant::now();
    let mut delay = Duration::from_millis(100);
    let error = loop {
        match context.publisher.publish(&Topology::worker_key(worker_id), &message).await {
            Ok(()) => {
                let now = chrono::Utc::now();
                for (execution, _) in sent {
                    let requested_at = execution.not_before.unwrap_or(execution.created);
                    let latency = (now - requested_at).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6;
                    metrics::observe(&metrics::DISPATCH_LATENCY, &[], latency);
                }
                metrics::increment(&metrics::DISPATCHES, &[], sent.len() as u64);
                tracing::debug!(executions = ids.len(), worker_id, execution_ids = ?ids, "dispatched");
                drop(dispatching);
                return;
            }
            // the worker's queue is gone or unbound (it is stopping): no point in trying again
            Err(e @ MqError::Unroutable(_)) => break e,
            Err(e) if started.elapsed() + delay >= DISPATCH_PATIENCE => break e,
            Err(e) => {
                tracing::debug!(execution_ids = ?ids, worker_id, error = %e, "dispatch failed, trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    };
    for (execution, runtime) in sent {
        tracing::warn!(execution_id = execution.id, worker_id, error = %error, "could not dispatch; the execution waits again");
        give_back(context, execution, Some(runtime)).await;
    }
}

/// scheduled → requested for a dispatch that was not sent: the execution waits again, its retry
/// budget untouched. Waits out a database outage.
async fn give_back(context: &Context, claimed: &Claimed, runtime: Option<&str>) {
    let handed_back = db::retry_while_unavailable("handing back a dispatch", || {
        db::execution::hand_back(&context.db, claimed.id, claimed.worker)
    })
    .await;
    match handed_back {
        Ok(_) => {
            metrics::increment(&metrics::HANDED_BACK, &[("by", "executor")], 1);
            match runtime {
                Some(runtime) => context.waiting.mark(runtime),
                None => context.waiting.mark_all(),
            }
        }
        // left `scheduled`: the monitor hands it back once it is old enough
        Err(e) => tracing::error!(execution_id = claimed.id, error = %e, "could not hand back an unsent dispatch"),
    }
}

/// Fails a claimed execution that cannot be dispatched at all (its action is gone).
async fn fail_claimed(
    context: &Context,
    claimed: &Claimed,
    kind: FailureKind,
    reason: String,
) -> Result<(), crate::Error> {
    let Some(execution) = db::execution::get(&context.db, claimed.id).await? else { return Ok(()) };
    record(context, &execution, ExecutionStatus::Scheduled, kind, reason).await
}

/// Fails a waiting execution through the RetryManager (so a retriable failure such as
/// `worker_unavailable` is retried with backoff).
async fn fail(context: &Context, execution: &Execution, kind: FailureKind, reason: String) -> Result<(), crate::Error> {
    record(context, execution, ExecutionStatus::Requested, kind, reason).await
}

async fn record(
    context: &Context,
    execution: &Execution,
    from: ExecutionStatus,
    kind: FailureKind,
    reason: String,
) -> Result<(), crate::Error> {
    tracing::warn!(execution_id = execution.id, failure_kind = %kind, %reason, "execution cannot be scheduled");
    let _span = attune_common::trace::failure_span(execution.id, execution.trace_parent.as_deref(), Some(kind));
    let outcome = Outcome { failure_kind: Some(kind), error: Some(reason), ..Default::default() };
    context.retry_manager.record_failure(execution, ExecutionStatus::Failed, &[from], None, &outcome).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_runtime_waits_half_the_expected_time_or_twice_its_last_wait_within_bounds() {
        let least = Duration::from_millis(10);
        // (expected: what `Picture::room_expected_in` says, tested in `health_probe`)
        let table = [
            (Some(200), None, 100),
            (Some(12), None, 10),
            (Some(60_000), Some(250), 250),
            (None, None, 10),
            (None, Some(10), 20),
            (None, Some(160), 250),
        ];
        for (room_in, last, wait) in table {
            let got = full_wait(room_in.map(Duration::from_millis), last.map(Duration::from_millis), least);
            assert_eq!(got, Duration::from_millis(wait), "{room_in:?} {last:?}");
        }
    }
}
