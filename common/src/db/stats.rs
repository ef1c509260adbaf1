//! Aggregates over executions for `/stats/*` and `/metrics`. Terminal states are bound from
//! `ExecutionStatus::TERMINAL`, never written out in SQL.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use attune_core::ExecutionStatus;

/// Over the executions created in the last `window_secs`: originals, retries, retries that
/// completed, and retries that finished (any terminal state).
pub async fn retry_totals(db: &PgPool, window_secs: f64) -> Result<(i64, i64, i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE retry_count = 0), count(*) FILTER (WHERE retry_count > 0), \
            count(*) FILTER (WHERE retry_count > 0 AND status = 'completed'), \
            count(*) FILTER (WHERE retry_count > 0 AND status = ANY($2)) \
         FROM execution WHERE created > now() - make_interval(secs => $1)",
    )
    .bind(window_secs)
    .bind(&ExecutionStatus::TERMINAL[..])
    .fetch_one(db)
    .await
}

/// Per retry reason over the same window: (reason, retries, completed, finished), most first.
pub async fn retries_by_reason(db: &PgPool, window_secs: f64) -> Result<Vec<(String, i64, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT COALESCE(retry_reason, 'unknown'), count(*), count(*) FILTER (WHERE status = 'completed'), \
            count(*) FILTER (WHERE status = ANY($2)) \
         FROM execution WHERE retry_count > 0 AND created > now() - make_interval(secs => $1) \
         GROUP BY 1 ORDER BY 2 DESC, 1",
    )
    .bind(window_secs)
    .bind(&ExecutionStatus::TERMINAL[..])
    .fetch_all(db)
    .await
}

/// One row per (bucket, reason) of the executions created in `[start, end]`, cut into `count`
/// buckets of `bucket_secs`: (bucket, reason — `None` for originals, total, completed, finished).
pub async fn retry_buckets(
    db: &PgPool,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    bucket_secs: f64,
    count: i64,
) -> Result<Vec<(i64, Option<String>, i64, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT LEAST(floor(extract(epoch FROM created - $1) / $2)::bigint, $3 - 1), \
            CASE WHEN retry_count > 0 THEN COALESCE(retry_reason, 'unknown') END, count(*), \
            count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = ANY($5)) \
         FROM execution WHERE created >= $1 AND created <= $4 GROUP BY 1, 2",
    )
    .bind(start)
    .bind(bucket_secs)
    .bind(count)
    .bind(end)
    .bind(&ExecutionStatus::TERMINAL[..])
    .fetch_all(db)
    .await
}

/// Executions by status and action, for the `attune_executions` gauge.
pub async fn by_status_and_action(db: &PgPool) -> Result<Vec<(ExecutionStatus, String, i64)>, sqlx::Error> {
    sqlx::query_as("SELECT status, action_ref, count(*) FROM execution GROUP BY status, action_ref ORDER BY 1, 2")
        .fetch_all(db)
        .await
}
