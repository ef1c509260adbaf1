//! The timeout monitor (Phase 1 of the defense in depth): a singleton loop across executors, held
//! by a PostgreSQL advisory lock, that finds what the message flow lost and puts it right.
//!
//! Each pass:
//! - fails executions stuck in `scheduling` (a claim by an earlier version) as
//!   `worker_unavailable`;
//! - hands back to waiting the executions left `scheduled` past the queue TTL plus a grace
//!   period that no worker holds (workers keep what they hold marked): their dispatch was lost
//!   (an executor died between its claim and the publish), they never started, so no retry is
//!   spent. Waiting `requested` executions need nothing from the monitor: every scheduler sweeps
//!   them (see `scheduler`), so nothing is re-published;
//! - finds active workers whose heartbeat is stale: marks them inactive, hands their `scheduled`
//!   executions back to waiting at once (never started: no retry spent) and fails their `running` ones as
//!   `worker_heartbeat_stale` (then retried, or `abandoned` for non-idempotent actions);
//! - fails `running` executions well past their deadline as `timeout`.
//!
//! Every failure goes through the RetryManager with a guarded transition, so a late message from
//! a worker that comes back changes nothing.

use std::sync::Arc;

use attune_common::db::{self, execution::Outcome};
use attune_common::{ExecutionStatus, FailureKind};
use tokio_util::sync::CancellationToken;

use crate::Context;

/// The advisory lock key of the monitor ("attune" in ASCII, then 1).
const MONITOR_LOCK: i64 = 0x6174_7475_6e65_0001;
const BATCH: i64 = 500;

pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    // After the database was unreachable, workers' heartbeats could not land either: judge
    // heartbeats again only once they have had a full staleness window to catch up.
    let grace = std::time::Duration::from_secs(context.settings.health.heartbeat_max_age_secs.max(1) as u64);
    let mut last_failure: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(context.settings.monitor_interval) => {}
        }
        let judge_heartbeats = last_failure.is_none_or(|at| at.elapsed() >= grace);
        if let Err(e) = tick(&context, judge_heartbeats).await {
            tracing::warn!(error = %e, "monitor pass failed");
            last_failure = Some(std::time::Instant::now());
        }
    }
}

/// One pass, if this executor holds the singleton lock (session-level locks are tied to a
/// connection, so it is taken and released on one pooled connection).
pub async fn tick(context: &Context, judge_heartbeats: bool) -> Result<bool, crate::Error> {
    let mut connection = context.db.acquire().await?;
    let locked: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(MONITOR_LOCK).fetch_one(&mut *connection).await?;
    if !locked {
        return Ok(false);
    }
    let result = sweep(context, judge_heartbeats).await;
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(MONITOR_LOCK).execute(&mut *connection).await?;
    result.map(|()| true)
}

/// One sweep. A failure on one execution is logged and the sweep goes on (a broker outage must
/// not stop the recoveries that need only the database); database errors end it.
async fn sweep(context: &Context, judge_heartbeats: bool) -> Result<(), crate::Error> {
    let settings = &context.settings;
    let stuck = |status: &str, secs: f64| {
        sqlx::query_scalar::<_, i64>(
            "SELECT id FROM execution WHERE status = $1::execution_status \
             AND updated < now() - make_interval(secs => $2) ORDER BY id LIMIT $3",
        )
        .bind(status.to_string())
        .bind(secs)
        .bind(BATCH)
        .fetch_all(&context.db)
    };
    for id in stuck("scheduling", settings.scheduling_timeout.as_secs_f64()).await? {
        fail(context, id, ExecutionStatus::Scheduling, FailureKind::WorkerUnavailable, "stuck in scheduling").await?;
    }
    let scheduled_limit = (settings.worker_queue_ttl + settings.running_grace).as_secs_f64();
    for id in stuck("scheduled", scheduled_limit).await? {
        hand_back(context, id).await?;
    }

    if judge_heartbeats {
        dead_workers(context).await?;
    }

    let overdue: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM execution WHERE status = 'running' \
         AND started + make_interval(secs => COALESCE(timeout_seconds, $1) + $2) < now() ORDER BY id LIMIT $3",
    )
    .bind(settings.common.default_timeout_secs as f64)
    .bind(settings.running_grace.as_secs_f64())
    .bind(BATCH)
    .fetch_all(&context.db)
    .await?;
    for id in overdue {
        fail(context, id, ExecutionStatus::Running, FailureKind::Timeout, "still running well past its timeout")
            .await?;
    }
    Ok(())
}

/// Workers whose heartbeat is stale: marked inactive; their dispatched work is handed back to
/// waiting at once (never started: no retry spent) and their running work failed as
/// `worker_heartbeat_stale` (retried, or `abandoned` for non-idempotent actions).
async fn dead_workers(context: &Context) -> Result<(), crate::Error> {
    let settings = &context.settings;
    let dead_workers: Vec<i64> = sqlx::query_scalar(
        "UPDATE worker SET status = 'inactive', updated = now() WHERE status <> 'inactive' \
         AND (last_heartbeat IS NULL OR last_heartbeat < now() - make_interval(secs => $1)) RETURNING id",
    )
    .bind(settings.health.heartbeat_max_age_secs as f64)
    .fetch_all(&context.db)
    .await?;
    for worker_id in &dead_workers {
        tracing::warn!(worker_id, "worker heartbeat is stale: marked inactive");
    }
    let orphaned: Vec<(i64, ExecutionStatus)> = sqlx::query_as(
        "SELECT e.id, e.status FROM execution e JOIN worker w ON w.id = e.worker \
         WHERE e.status IN ('scheduled', 'running') \
           AND (w.last_heartbeat IS NULL OR w.last_heartbeat < now() - make_interval(secs => $1)) \
         ORDER BY e.id LIMIT $2",
    )
    .bind(settings.health.heartbeat_max_age_secs as f64)
    .bind(BATCH)
    .fetch_all(&context.db)
    .await?;
    for (id, status) in orphaned {
        match status {
            // never started: it waits again for a worker, with no retry spent
            ExecutionStatus::Scheduled => hand_back(context, id).await?,
            _ => {
                fail(
                    context,
                    id,
                    status,
                    FailureKind::WorkerHeartbeatStale,
                    "its worker stopped heartbeating while it ran",
                )
                .await?
            }
        }
    }
    Ok(())
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
    let Some(current) = db::execution::get(&context.db, execution_id).await? else { return Ok(()) };
    let reported = if kind == FailureKind::Timeout { ExecutionStatus::Timeout } else { ExecutionStatus::Failed };
    let outcome =
        Outcome { failure_kind: Some(kind.to_string()), error: Some(reason.to_string()), ..Default::default() };
    if let Some(recorded) = context.retry_manager.record_failure(&current, reported, &[from], None, &outcome).await? {
        attune_common::metrics::increment(&attune_common::metrics::MONITOR_RECOVERIES, &[("kind", kind.as_str())], 1);
        tracing::warn!(execution_id, worker_id = ?current.worker, failure_kind = %kind, status = %recorded.execution.status, "monitor: {reason}");
    }
    Ok(())
}
