//! The executors' background looks: dispatches lost on the way, runs held by workers gone
//! silent, runs past their timeout, rows unchanged for too long, retries due, and the
//! concurrency slots of runs whose processes are gone.

use sqlx::PgPool;

use attune_core::status::ExecutionStatus;

use super::Transition;

/// A result for the run `run_token` of `execution_id` on `worker_id` came after the run was
/// ended by hand: its processes are gone, and its concurrency slot is free. Whether it was.
pub async fn release_stale(
    db: &PgPool,
    execution_id: i64,
    worker_id: i64,
    run_token: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE execution SET lingering = false \
         WHERE id = $1 AND lingering AND worker = $2 AND run_token IS NOT DISTINCT FROM $3",
    )
    .bind(execution_id)
    .bind(worker_id)
    .bind(run_token)
    .execute(db)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// The runs ended by hand on workers no longer active (taken for dead, which stopped their runs
/// first, or stopped) free their concurrency slots. How many did.
pub async fn release_of_inactive(db: &PgPool) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE execution e SET lingering = false FROM worker w \
         WHERE e.lingering AND w.id = e.worker AND w.status = 'inactive'",
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Dispatches lost on their way: executions `scheduled` on an active worker that its heartbeats
/// since (each marks what the worker holds first, `keep_held`) did not mark, `slack` after they
/// were scheduled or last marked. A dispatch reaches a consuming worker in milliseconds, so the
/// message was never sent (its executor died between its claim and its publish) or went to a
/// queue nobody takes from; oldest id first.
pub async fn lost_dispatches(
    db: &PgPool,
    slack: std::time::Duration,
    limit: i64,
) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.id, w.id FROM execution e JOIN worker w ON w.id = e.worker \
         WHERE e.status = $1 AND w.status = 'active' AND e.updated < w.last_heartbeat - make_interval(secs => $2) \
         ORDER BY e.id LIMIT $3",
    )
    .bind(ExecutionStatus::Scheduled)
    .bind(slack.as_secs_f64())
    .bind(limit)
    .persistent(false)
    .fetch_all(db)
    .await
}

/// The batch form of `transition` for the retry timer: due `delayed` retries become `requested`.
/// `SKIP LOCKED` lets several executors run it at once without handing out a retry twice.
/// Returns each promoted execution's id and runtime.
pub async fn promote_due_retries(db: &PgPool, limit: i64) -> Result<Vec<(i64, Option<String>)>, sqlx::Error> {
    Transition::to(ExecutionStatus::Requested).from(&[ExecutionStatus::Delayed]).check();
    sqlx::query_as(
        "UPDATE execution SET status = 'requested', updated = now() WHERE id IN ( \
            SELECT id FROM execution WHERE status = 'delayed' AND not_before <= now() \
            ORDER BY not_before LIMIT $1 FOR UPDATE SKIP LOCKED) \
         AND status = 'delayed' RETURNING id, runtime",
    )
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Executions in `status` not updated for `older_than` (the monitor's stuck work), oldest id
/// first.
///
/// (This and the monitor's other reads by a bound status run as unnamed statements, planned for
/// the status they are given: a cached generic plan, made for "some status", walks the primary
/// key through all of history for the id order, 2-3.5 s at 10 million rows, where the plan for
/// `scheduled` reads a few index entries.)
pub async fn unchanged_for(
    db: &PgPool,
    status: ExecutionStatus,
    older_than: std::time::Duration,
    limit: i64,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM execution WHERE status = $1 AND updated < now() - make_interval(secs => $2) ORDER BY id LIMIT $3",
    )
    .bind(status)
    .bind(older_than.as_secs_f64())
    .bind(limit)
    .persistent(false)
    .fetch_all(db)
    .await
}

/// `running` executions started longer ago than their own timeout (or `default_timeout_secs`)
/// plus `grace` (`recovery::OVERDUE` says what is done with them).
pub async fn overdue(
    db: &PgPool,
    default_timeout_secs: i32,
    grace: std::time::Duration,
    limit: i64,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM execution WHERE status = $1 \
         AND started + make_interval(secs => COALESCE(timeout_seconds, $2) + $3) < now() ORDER BY id LIMIT $4",
    )
    .bind(ExecutionStatus::Running)
    .bind(default_timeout_secs as f64)
    .bind(grace.as_secs_f64())
    .bind(limit)
    .persistent(false)
    .fetch_all(db)
    .await
}

/// Executions in one of `statuses` whose worker's heartbeat is older than `max_age` (or which
/// never sent one), with their status.
pub async fn held_by_silent_workers(
    db: &PgPool,
    statuses: &[ExecutionStatus],
    max_age: std::time::Duration,
    limit: i64,
) -> Result<Vec<(i64, ExecutionStatus)>, sqlx::Error> {
    // (planned for the statuses given, as `unchanged_for` says why: with them known, the
    // in-flight partial index serves it)
    sqlx::query_as(
        "SELECT e.id, e.status FROM execution e JOIN worker w ON w.id = e.worker \
         WHERE e.status = ANY($1) \
           AND (w.last_heartbeat IS NULL OR w.last_heartbeat < now() - make_interval(secs => $2)) \
           AND fence_open($2) \
         ORDER BY e.id LIMIT $3",
    )
    .bind(statuses)
    .bind(max_age.as_secs_f64())
    .bind(limit)
    .persistent(false)
    .fetch_all(db)
    .await
}
