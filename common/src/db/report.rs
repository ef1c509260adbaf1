//! Reports of finished runs kept in their running rows (migration `result_reports`): a worker
//! writes its report of a run (the `ExecutionResult` message, as JSON) into the row as well as
//! publishing it, so that a result the broker delays is still recorded as what it was. The
//! executors' monitor records the reports that waited longer than a patience (`waiting`), and
//! takes a run's report, if it has one, over a failure it would otherwise make up for it
//! (`of`). The report goes when the execution leaves `running` (a trigger).

use serde_json::Value;
use sqlx::PgPool;

use attune_core::ExecutionStatus;

/// Keeps `report` in the row of execution `id` while it runs on `worker` with `run_token`;
/// `false` if it no longer does (the report is stale).
pub async fn keep(
    db: &PgPool,
    id: i64,
    worker: i64,
    run_token: Option<&str>,
    report: &Value,
) -> Result<bool, sqlx::Error> {
    let kept = sqlx::query(
        "UPDATE execution SET report = $4, reported_at = now() \
         WHERE id = $1 AND status = $5 AND worker = $2 AND run_token IS NOT DISTINCT FROM $3",
    )
    .bind(id)
    .bind(worker)
    .bind(run_token)
    .bind(report)
    .bind(ExecutionStatus::Running)
    .execute(db)
    .await?;
    Ok(kept.rows_affected() == 1)
}

/// The reports of running executions kept longer than `patience` (oldest first), at most
/// `limit`, with their executions' ids.
pub async fn waiting(db: &PgPool, patience: std::time::Duration, limit: i64) -> Result<Vec<(i64, Value)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, report FROM execution WHERE report IS NOT NULL \
         AND reported_at < now() - make_interval(secs => $1) AND status = $2 ORDER BY reported_at LIMIT $3",
    )
    .bind(patience.as_secs_f64())
    .bind(ExecutionStatus::Running)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Drops the report kept in the row of execution `id` (one that cannot be recorded).
pub async fn discard(db: &PgPool, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution SET report = NULL, reported_at = NULL WHERE id = $1 AND report IS NOT NULL")
        .bind(id)
        .execute(db)
        .await
        .map(|_| ())
}

/// The report kept in the row of running execution `id`, if any.
pub async fn of(db: &PgPool, id: i64) -> Result<Option<Value>, sqlx::Error> {
    sqlx::query_scalar("SELECT report FROM execution WHERE id = $1 AND status = $2 AND report IS NOT NULL")
        .bind(id)
        .bind(ExecutionStatus::Running)
        .fetch_optional(db)
        .await
}
