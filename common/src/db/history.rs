//! History: removing what is past its age (`attune_core::retention` states the rule), archiving it
//! first when asked, and counting finished minutes into `execution_rollup` for the statistics.
//!
//! Every statement here is bounded: retention walks one finished status at a time, oldest first,
//! `batch` executions per statement and transaction, through `execution_status_id_idx`; the
//! rollup counts at most a day of executions per call through `execution_created_idx`.

use sqlx::PgPool;

use attune_core::ExecutionStatus;
use attune_core::retention::Retention;

/// What one retention statement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    /// Executions removed (whole chains).
    pub removed: i64,
    /// Executions of the walked status looked at (the batch, or fewer at its end).
    pub examined: i64,
    /// The last id looked at: the next statement starts after it.
    pub last: Option<i64>,
}

/// The chains of the executions of `status` removable by `retention`: up to `batch` of them
/// with ids above `after`, oldest first. A chain goes whole, and only when every attempt in it
/// finished longer ago than its own status's age (its action's own, where the action's pack set
/// one in `retention:`, else the executors'); its executions are moved into `execution_archive`
/// first when `archive` is set.
pub async fn prune_batch(
    db: &PgPool,
    retention: &Retention,
    status: ExecutionStatus,
    after: i64,
    batch: i64,
    archive: bool,
) -> Result<Pruned, sqlx::Error> {
    // the walk's age: the shortest of the executors' and of the actions' own for this status
    let shortest_of_actions: Option<f64> = sqlx::query_scalar(
        "SELECT min((retention->>$1)::float8) FROM action WHERE retention ? $1 AND jsonb_typeof(retention->$1) = 'number'",
    )
    .bind(status.as_str())
    .fetch_one(db)
    .await?;
    let global = retention.age(status).and_then(|age| age.secs());
    let age_secs = match (global, shortest_of_actions) {
        (Some(global), Some(action)) => global.min(action),
        (Some(age), None) | (None, Some(age)) => age,
        (None, None) => return Ok(Pruned { removed: 0, examined: 0, last: None }),
    };
    let (statuses, ages): (Vec<ExecutionStatus>, Vec<f64>) = retention.removed().into_iter().unzip();
    // The candidates: `status`, finished past the age, among ids no newer than the newest
    // execution created before the cutoff (an execution finishes after it is created), so the
    // walk ends there instead of reading every recent row of the status. Then each candidate's
    // chain: up to its first attempt, down to its last; the chain goes if every attempt is past
    // its own status's age (an unfinished status has no age, so any unfinished attempt keeps it).
    // A workflow step's chain stays as long as its run does: a retry of the run reads what its
    // steps did, and a run still going reads its finished steps.
    let archive_step = if archive { ", archived AS (INSERT INTO execution_archive SELECT * FROM gone)" } else { "" };
    let statement = format!(
        "WITH RECURSIVE policy AS (SELECT * FROM unnest($1::execution_status[], $2::float8[]) AS p(status, secs)), \
         bound AS (SELECT id FROM execution WHERE created < now() - make_interval(secs => $4) \
                   ORDER BY created DESC LIMIT 1), \
         candidate AS (SELECT id FROM execution \
                       WHERE status = $3 AND id > $5 AND id <= (SELECT id FROM bound) \
                         AND finished < now() - make_interval(secs => $4) \
                       ORDER BY status, id LIMIT $6), \
         up AS (SELECT e.id, e.original_execution FROM execution e WHERE e.id IN (SELECT id FROM candidate) \
                UNION \
                SELECT p.id, p.original_execution FROM execution p JOIN up ON p.id = up.original_execution), \
         down AS (SELECT e.id AS root, e.id, e.status, e.finished, e.action, e.workflow_run FROM execution e \
                  WHERE e.id IN (SELECT id FROM up WHERE original_execution IS NULL) \
                  UNION ALL \
                  SELECT down.root, e.id, e.status, e.finished, e.action, e.workflow_run FROM execution e \
                  JOIN down ON e.original_execution = down.id), \
         aged AS (SELECT down.root, down.finished, down.workflow_run, \
                         CASE WHEN a.retention ? down.status::text \
                              THEN (a.retention->>down.status::text)::float8 ELSE policy.secs END AS secs \
                  FROM down LEFT JOIN policy ON policy.status = down.status \
                  LEFT JOIN action a ON a.id = down.action), \
         removable AS (SELECT aged.root FROM aged GROUP BY aged.root \
                       HAVING bool_and(aged.finished IS NOT NULL AND aged.secs IS NOT NULL \
                                       AND aged.finished < now() - make_interval(secs => aged.secs) \
                                       AND (aged.workflow_run IS NULL OR NOT EXISTS ( \
                                           SELECT 1 FROM execution r WHERE r.id = aged.workflow_run)))), \
         gone AS (DELETE FROM execution WHERE id IN (SELECT id FROM down WHERE root IN (SELECT root FROM removable)) \
                  RETURNING *){archive_step} \
         SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM candidate), (SELECT max(id) FROM candidate)"
    );
    // (planned for the status given, as `db::execution::monitor::unchanged_for` says why)
    let (removed, examined, last): (i64, i64, Option<i64>) = sqlx::query_as(sqlx::AssertSqlSafe(statement))
        .persistent(false)
        .bind(&statuses)
        .bind(&ages)
        .bind(status)
        .bind(age_secs)
        .bind(after)
        .bind(batch)
        .fetch_one(db)
        .await?;
    Ok(Pruned { removed, examined, last })
}

/// Removes the rows of workers inactive for longer than `age_secs` (since their last heartbeat)
/// that no unfinished execution names (one held, `scheduled` or `running`); returns how many. Finished
/// executions keep the id of the worker that ran them (`execution.worker` has no foreign key).
pub async fn prune_workers(db: &PgPool, age_secs: f64) -> Result<u64, sqlx::Error> {
    sqlx::query(
        "DELETE FROM worker w WHERE w.status = 'inactive' \
           AND COALESCE(w.last_heartbeat, w.updated) < now() - make_interval(secs => $1) \
           AND NOT EXISTS (SELECT 1 FROM execution e WHERE e.status = ANY($2) AND e.worker = w.id)",
    )
    .bind(age_secs)
    .bind(&ExecutionStatus::IN_FLIGHT[..])
    .execute(db)
    .await
    .map(|done| done.rows_affected())
}

/// How long after an execution is created its minute is counted, at the earliest.
pub const ROLLUP_LAG_SECS: f64 = 60.0;
/// An unfinished execution holds the rollup back (so that its minute is counted once it has
/// finished) for this long at most; one still unfinished after that is counted as unfinished.
pub const ROLLUP_HOLD_SECS: f64 = 900.0;

/// Counts into `execution_rollup` the minutes that are over: up to a minute ago, or to the
/// minute of the oldest unfinished execution if that is later than `ROLLUP_HOLD_SECS` ago, a
/// day at most per call. Returns where the rollup reaches.
pub async fn rollup(db: &PgPool) -> Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT execution_rollup_advance(date_trunc('minute', GREATEST(LEAST( \
                now() - make_interval(secs => $2), \
                COALESCE((SELECT min((SELECT created FROM execution WHERE status = s ORDER BY status, id LIMIT 1)) \
                          FROM unnest($1::execution_status[]) AS s), now())), \
              now() - make_interval(secs => $3))), interval '1 day')",
    )
    .bind(&ExecutionStatus::UNFINISHED[..])
    .bind(ROLLUP_LAG_SECS)
    .bind(ROLLUP_HOLD_SECS)
    .fetch_one(db)
    .await
}

/// How long rollup minutes are kept: the longest statistics window (30 days) and a day.
pub const ROLLUP_KEEP_SECS: f64 = 31.0 * 86_400.0;

/// Removes rollup minutes older than `ROLLUP_KEEP_SECS`.
pub async fn prune_rollup(db: &PgPool) -> Result<u64, sqlx::Error> {
    sqlx::query("DELETE FROM execution_rollup WHERE minute < now() - make_interval(secs => $1)")
        .bind(ROLLUP_KEEP_SECS)
        .execute(db)
        .await
        .map(|done| done.rows_affected())
}

/// Vacuums `execution` (its space goes back to new rows) unless another vacuum of it is under way.
pub async fn vacuum(db: &PgPool) -> Result<(), sqlx::Error> {
    // (as long as it takes, but not behind another vacuum; the connection goes back to the pool
    // with its session's own limits, or is closed)
    let mut connection = db.acquire().await?;
    sqlx::query("SET statement_timeout = 0").execute(&mut *connection).await?;
    sqlx::query("SET lock_timeout = '1s'").execute(&mut *connection).await?;
    let result = sqlx::query("VACUUM (ANALYZE) execution").execute(&mut *connection).await;
    if super::restore_limits(&mut connection).await.is_err() {
        drop(connection.detach());
    }
    match result {
        // lock_not_available: autovacuum (or an operator) is at it already
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => Ok(()),
        other => other.map(|_| ()),
    }
}

/// How many rows the planner thinks `execution` has (from the last vacuum or analyze).
pub async fn estimated_rows(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = 'execution'::regclass")
        .fetch_one(db)
        .await
}
