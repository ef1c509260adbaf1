//! Reads and fixtures of the benchmark (`attune-bench`): the commit counter, how each chain of
//! attempts ended, the retries' delays, run slots, and a registered fleet of idle workers.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// The database's transaction counter: its growth over a run is the number of commits.
pub async fn transaction_counter(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT txid_current()").fetch_one(db).await
}

/// Writes out every dirty buffer now (a superuser's or `pg_checkpoint`'s connection), so that a
/// measurement starts as the floor's does, rather than with whatever checkpoint the workload
/// before left due.
pub async fn checkpoint(admin: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("CHECKPOINT").execute(admin).await.map(|_| ())
}

/// For each of `ids`: (id, finished as epoch seconds, completed?, the retry that follows it).
pub async fn attempts(db: &PgPool, ids: &[i64]) -> Result<Vec<(i64, Option<f64>, bool, Option<i64>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.id, extract(epoch FROM e.finished)::float8, e.status = 'completed', r.id \
         FROM execution e LEFT JOIN execution r ON r.original_execution = e.id WHERE e.id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(db)
    .await
}

/// For each retry created since `since` that started: (its backoff, the time from its parent's
/// end to its start), in seconds.
pub async fn retry_delays(db: &PgPool, since: DateTime<Utc>) -> Result<Vec<(f64, f64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT extract(epoch FROM r.not_before - p.finished)::float8, extract(epoch FROM r.started - p.finished)::float8 \
         FROM execution r JOIN execution p ON p.id = r.original_execution WHERE r.created >= $1 AND r.started IS NOT NULL",
    )
    .bind(since)
    .fetch_all(db)
    .await
}

/// The run slots (summed concurrency) of the active workers offering `runtime`.
pub async fn run_slots(db: &PgPool, runtime: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(sum((capabilities->>'concurrency')::bigint), 0)::bigint FROM worker \
         WHERE status = 'active' AND capabilities->'runtimes' ? $1",
    )
    .bind(runtime)
    .fetch_one(db)
    .await
}

/// Registers (or refreshes) `count` idle workers named `bench-idle-N` that offer `builtin` and
/// report a full queue, so that every scheduling decision must weigh them.
pub async fn register_idle_fleet(db: &PgPool, count: i64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO worker (name, status, capabilities, last_heartbeat) \
         SELECT 'bench-idle-' || n, 'active', '{\"runtimes\": [\"builtin\"], \"health\": {\"consecutive_failures\": 0, \"queue_depth\": 1000}}', now() \
         FROM generate_series(1, $1) n ON CONFLICT (name) DO UPDATE SET status = 'active', last_heartbeat = now()",
    )
    .bind(count)
    .execute(db)
    .await
    .map(|_| ())
}

/// Keeps the idle fleet's heartbeats fresh.
pub async fn heartbeat_idle_fleet(db: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE worker SET last_heartbeat = now() WHERE name LIKE 'bench-idle-%'").execute(db).await.map(|_| ())
}

/// Removes the idle fleet.
pub async fn remove_idle_fleet(db: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM worker WHERE name LIKE 'bench-idle-%'").execute(db).await.map(|_| ())
}
