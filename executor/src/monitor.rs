//! The timeout monitor (Phase 1 of the defense in depth): a singleton loop across executors, held
//! by a PostgreSQL advisory lock, that finds what the message flow lost and puts it right.
//!
//! Each pass (a statement that fails for one execution is logged and the pass goes on to the
//! next; only the database out of reach ends it, and suspends judging heartbeats):
//! - fails executions stuck in `scheduling` (a claim by an earlier version) as
//!   `worker_unavailable`;
//! - hands back to waiting the executions `scheduled` on an active worker that its heartbeats
//!   since did not mark as held (workers mark what they hold before each heartbeat): their
//!   dispatch was lost (an executor died between its claim and the publish), they never started,
//!   so no retry is spent. Such a worker, alive but not receiving (cut off from the broker
//!   alone), is passed over for a while (`recovery::not_receiving_for`). And, whatever the worker, those left `scheduled` past the queue TTL
//!   plus a grace period. Waiting `requested` executions need nothing from the monitor: every scheduler sweeps
//!   them (see `scheduler`), so nothing is re-published;
//! - finds active workers whose heartbeat is stale: marks them inactive, hands their `scheduled`
//!   executions back to waiting at once (never started: no retry spent) and fails their `running` ones as
//!   `worker_heartbeat_stale` (then retried, or `abandoned` for non-idempotent actions);
//! - fails `running` executions well past their deadline as `timeout`;
//! - and before any of that, records the results that workers kept in their rows and the broker
//!   has not brought within `REPORT_PATIENCE` (`db::report`): a run whose worker reported how it
//!   ended is recorded as that, never as `timeout` or `worker_heartbeat_stale`.
//!
//! The rules (what counts as stuck after how long, and what is done with it) are
//! `attune_core::recovery`; this module finds the rows and carries the decisions out. Every
//! failure goes through the RetryManager with a guarded transition, so a late message from
//! a worker that comes back changes nothing.

use std::sync::Arc;

use attune_common::db::{self, execution::Outcome};
use attune_core::recovery::{self, MonitorLimits, Recovery};
use attune_core::{ExecutionStatus, FailureKind};
use tokio_util::sync::CancellationToken;

use crate::Context;

/// The advisory lock key of the monitor ("attune" in ASCII, then 1).
const MONITOR_LOCK: i64 = 0x6174_7475_6e65_0001;
const BATCH: i64 = 500;
/// How long after it was scheduled a dispatch must have reached its worker, by the worker's
/// heartbeats (`db::execution::monitor::lost_dispatches`).
/// (the scheduler tries a publish for up to 5 s before it hands the execution back itself)
const LOST_DISPATCH_SLACK: std::time::Duration = std::time::Duration::from_secs(6);
/// How long the monitor's lock outlives a stalled holder (`db::leader`).
pub const LEADER_LEASE: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a report kept in its row (`db::report`) waits for its message before the monitor
/// records it from the row: the broker brings it in milliseconds when all is well.
const REPORT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(context.settings.monitor_interval) => {}
        }
        // After the database was out of reach, workers' heartbeats could not land either: they
        // are judged again only once they have had a full heartbeat limit to catch up
        // (`crate::fence`, which the workers are told of).
        let judge_heartbeats = context.fence.may_judge();
        if let Err(e) = tick(&context, judge_heartbeats).await {
            tracing::warn!(error = %e, "monitor pass failed");
            // (only the database out of reach suspends judging: any other error ends this pass
            // alone)
            if unreachable(&e) {
                context.fence.failed();
            }
        }
    }
}

/// One pass, if this executor holds the singleton lock (`db::leader`: a stalled holder loses it
/// after `LEADER_LEASE`).
pub async fn tick(context: &Context, judge_heartbeats: bool) -> Result<bool, crate::Error> {
    let Some(leadership) = db::leader::Leadership::try_take(&context.db, MONITOR_LOCK, LEADER_LEASE).await? else {
        return Ok(false);
    };
    leadership.run(sweep(context, judge_heartbeats)).await??;
    Ok(true)
}

/// The monitor's limits from the executor's settings.
fn limits(context: &Context) -> MonitorLimits {
    let settings = &context.settings;
    MonitorLimits {
        scheduling_timeout: settings.scheduling_timeout,
        queue_ttl: settings.worker_queue_ttl,
        grace: settings.running_grace,
    }
}

/// Whether an error says the database is out of reach (which ends a sweep), not that one
/// statement failed.
fn unreachable(error: &crate::Error) -> bool {
    match error {
        crate::Error::Database(e) => db::is_connection_lost(e) || matches!(e, sqlx::Error::PoolTimedOut),
        _ => false,
    }
}

/// A failure to recover one execution is logged and the sweep goes on to the next; the database
/// out of reach ends the sweep.
fn next_row(result: Result<(), crate::Error>, execution_id: i64) -> Result<(), crate::Error> {
    match result {
        Err(e) if !unreachable(&e) => {
            tracing::warn!(execution_id, error = %e, "monitor: could not recover an execution; the sweep goes on");
            Ok(())
        }
        other => other,
    }
}

/// One sweep. A failure on one execution is logged and the sweep goes on (a broker outage, or a
/// statement failing for one row, must not stop the recoveries of the others); the database out
/// of reach ends it.
async fn sweep(context: &Context, judge_heartbeats: bool) -> Result<(), crate::Error> {
    let limits = limits(context);
    // reports the broker has not brought in time are recorded from their rows, before anything
    // below could take their runs for lost
    for (id, report) in db::report::waiting(&context.db, REPORT_PATIENCE, BATCH).await? {
        match record_report(context, report).await {
            Ok(true) => {}
            // (not read first at every pass: the sweeps below judge the run)
            Ok(false) => db::report::discard(&context.db, id).await?,
            Err(e) => {
                tracing::warn!(execution_id = id, error = %e, "monitor: could not record a report kept in its row")
            }
        }
    }
    for status in recovery::STUCK_STATUSES {
        let Some((after, recovery)) = limits.stuck(status) else { continue };
        for id in db::execution::monitor::unchanged_for(&context.db, status, after, BATCH).await? {
            next_row(recover(context, id, status, recovery).await, id)?;
        }
    }

    // dispatches lost on their way (an executor died between its claim and its publish, or the
    // worker does not receive: cut off from the broker alone, its heartbeats go on): found by
    // the heartbeats of their workers, in seconds. The worker is passed over for a heartbeat
    // limit, or the scheduler would send the execution straight back to it.
    let lost = db::execution::monitor::lost_dispatches(&context.db, LOST_DISPATCH_SLACK, BATCH).await?;
    let mut doubted = std::collections::BTreeSet::new();
    for &(id, worker_id) in &lost {
        if doubted.insert(worker_id) {
            let passed_over = recovery::not_receiving_for(context.settings.health.heartbeat_max_age_secs);
            db::worker::not_receiving(&context.db, worker_id, passed_over).await?;
            tracing::warn!(
                worker_id,
                passed_over_secs = passed_over.as_secs_f64(),
                "a dispatch to this worker was lost though it heartbeats: nothing is sent to it for a while"
            );
        }
        next_row(hand_back(context, id).await, id)?;
    }

    if judge_heartbeats {
        dead_workers(context).await?;
    }

    let default_timeout = context.settings.common.default_timeout_secs;
    for id in db::execution::monitor::overdue(&context.db, default_timeout, limits.grace, BATCH).await? {
        next_row(recover(context, id, ExecutionStatus::Running, recovery::OVERDUE).await, id)?;
    }
    Ok(())
}

/// Workers whose heartbeat is stale: marked inactive; what they held is recovered by
/// `recovery::orphaned` (dispatched work handed back, running work failed as
/// `worker_heartbeat_stale`).
async fn dead_workers(context: &Context) -> Result<(), crate::Error> {
    let max_age = std::time::Duration::from_secs(context.settings.health.heartbeat_max_age_secs.max(0) as u64);
    for worker_id in db::worker::deactivate_silent(&context.db, None, max_age).await? {
        tracing::warn!(worker_id, "worker heartbeat is stale: marked inactive");
    }
    // runs ended by hand on a worker taken for dead (its lease stopped them) or stopped: their
    // concurrency slots are free
    let released = db::execution::monitor::release_of_inactive(&context.db).await?;
    if released > 0 {
        tracing::warn!(released, "concurrency slots of runs ended by hand on inactive workers freed");
    }
    let orphaned =
        db::execution::monitor::held_by_silent_workers(&context.db, &recovery::HELD_BY_WORKER, max_age, BATCH).await?;
    for (id, status) in orphaned {
        if let Some(recovery) = recovery::orphaned(status) {
            next_row(recover(context, id, status, recovery).await, id)?;
        }
    }
    Ok(())
}

/// Records a report kept in its row (`db::report`) as the result message would have been;
/// `false` if it does not parse (a newer worker's, say), which leaves the run to the other sweeps.
async fn record_report(context: &Context, report: serde_json::Value) -> Result<bool, crate::Error> {
    match serde_json::from_value::<attune_common::mq::ExecutionResult>(report) {
        Ok(result) => {
            tracing::warn!(
                execution_id = result.execution_id,
                worker_id = result.worker_id,
                "monitor: recording a result the broker has not brought, from its row"
            );
            attune_common::metrics::increment(&attune_common::metrics::MONITOR_RECOVERIES, &[("kind", "report")], 1);
            crate::completion::record(context, &result).await?;
            Ok(true)
        }
        Err(e) => {
            tracing::error!(error = %e, "monitor: a report kept in a row does not parse; the run is judged without it");
            Ok(false)
        }
    }
}

async fn recover(context: &Context, id: i64, status: ExecutionStatus, recovery: Recovery) -> Result<(), crate::Error> {
    match recovery {
        Recovery::HandBack => hand_back(context, id).await,
        Recovery::Fail { kind, reason } => fail(context, id, status, kind, reason).await,
    }
}

/// A `scheduled` execution that no worker holds and whose dispatch would long have expired: it
/// never started, so it waits again, with no retry spent.
async fn hand_back(context: &Context, execution_id: i64) -> Result<(), crate::Error> {
    let Some(current) = db::execution::get(&context.db, execution_id).await? else { return Ok(()) };
    let Some(worker_id) = current.worker else { return Ok(()) };
    if db::execution::hand_back(&context.db, execution_id, worker_id).await?.is_some() {
        attune_common::metrics::increment(&attune_common::metrics::MONITOR_RECOVERIES, &[("kind", "handed_back")], 1);
        attune_common::metrics::increment(&attune_common::metrics::HANDED_BACK, &[("by", "monitor")], 1);
        tracing::warn!(execution_id, worker_id, "monitor: dispatch lost before it started; the execution waits again");
        match current.runtime.as_deref() {
            Some(runtime) => context.waiting.mark(runtime),
            None => context.waiting.mark_all(),
        }
    }
    Ok(())
}

async fn fail(
    context: &Context,
    execution_id: i64,
    from: ExecutionStatus,
    kind: FailureKind,
    reason: &str,
) -> Result<(), crate::Error> {
    // a run whose worker reported how it ended is recorded as that, not as what the monitor
    // would make of its silence (if the report records nothing, the failure below does: it is
    // guarded, so after a report that was recorded it changes nothing)
    if from == ExecutionStatus::Running
        && let Some(report) = db::report::of(&context.db, execution_id).await?
        && !record_report(context, report).await?
    {
        db::report::discard(&context.db, execution_id).await?;
    }
    let Some(current) = db::execution::get(&context.db, execution_id).await? else { return Ok(()) };
    let reported = kind.reported_status();
    let _span = attune_common::trace::failure_span(current.id, current.trace_parent.as_deref(), Some(kind));
    let outcome = Outcome { failure_kind: Some(kind), error: Some(reason.to_string()), ..Default::default() };
    if let Some(recorded) = context.retry_manager.record_failure(&current, reported, &[from], None, &outcome).await? {
        attune_common::metrics::increment(&attune_common::metrics::MONITOR_RECOVERIES, &[("kind", kind.as_str())], 1);
        tracing::warn!(execution_id, worker_id = ?current.worker, failure_kind = %kind, status = %recorded.execution.status, "monitor: {reason}");
    }
    Ok(())
}
