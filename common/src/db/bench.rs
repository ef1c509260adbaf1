//! Reads and fixtures of the benchmark (`attune-bench`): the commit counter, how each chain of
//! attempts ended, the retries' delays, run slots, a registered fleet of idle workers; and for the
//! `history` workload and the soak, the execution table's sizes, a loaded history of finished
//! executions, and the quick reference's SQL, kept verbatim (it is timed as written).

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
/// The retry is looked up per row through the unique index on `original_execution`: a join
/// let the planner hash the whole table (1.5 s a call at 10 million rows, which throttled the
/// history workload's own measurement of attune).
pub async fn attempts(db: &PgPool, ids: &[i64]) -> Result<Vec<(i64, Option<f64>, bool, Option<i64>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.id, extract(epoch FROM e.finished)::float8, e.status = 'completed', \
            (SELECT r.id FROM execution r WHERE r.original_execution = e.id) \
         FROM execution e WHERE e.id = ANY($1)",
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

/// The execution table's rows now.
pub async fn execution_count(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(db).await
}

/// The execution table's size now: (`pg_table_size`, `pg_indexes_size`,
/// `pg_total_relation_size`), summed over its partitions if it has any.
pub async fn execution_table_sizes(db: &PgPool) -> Result<(i64, i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT sum(pg_table_size(relid))::bigint, sum(pg_indexes_size(relid))::bigint, \
         sum(pg_total_relation_size(relid))::bigint \
         FROM (SELECT relid FROM pg_partition_tree('execution') UNION SELECT 'execution'::regclass) AS tree",
    )
    .fetch_one(db)
    .await
}

/// What the database vacuums by itself: the server's `autovacuum` setting and the execution
/// table's own storage parameters (`reloptions`; a migration may set per-table autovacuum
/// settings), empty when it has none.
pub async fn vacuum_settings(db: &PgPool) -> Result<(String, Vec<String>), sqlx::Error> {
    let autovacuum: String = sqlx::query_scalar("SELECT current_setting('autovacuum')").fetch_one(db).await?;
    let options: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions::text[] FROM pg_class WHERE oid = 'execution'::regclass")
            .fetch_one(db)
            .await?;
    Ok((autovacuum, options.unwrap_or_default()))
}

/// For each of `ids` still in the table: (id, finished as epoch seconds, completed?).
pub async fn finished(db: &PgPool, ids: &[i64]) -> Result<Vec<(i64, Option<f64>, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, extract(epoch FROM finished)::float8, status = 'completed' FROM execution WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(db)
    .await
}

/// The ids of the registered workers but the idle fleet (`bench-idle-N`), in order.
pub async fn real_worker_ids(db: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM worker WHERE name NOT LIKE 'bench-idle-%' ORDER BY id").fetch_all(db).await
}

/// The id of the action `action_ref`, if it is registered.
pub async fn action_id(db: &PgPool, action_ref: &str) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM action WHERE ref = $1").bind(action_ref).fetch_optional(db).await
}

/// What a loaded history is spread over (see [`load_history_chunk`]).
pub struct HistoryLoad<'a> {
    /// Rows in the whole load.
    pub rows: i64,
    /// The history's start, epoch seconds: the first row's `created`.
    pub start_epoch: f64,
    /// The seconds between two rows' `created`.
    pub step_secs: f64,
    /// The workers to spread the rows over (none: no worker).
    pub workers: &'a [i64],
    /// The ids of `core.echo`, `core.noop`, `core.fail` and `core.flaky` (`None` if absent).
    pub actions: [Option<i64>; 4],
}

/// One chunk of history, rows `$1` to `$2 - 1` of `$3`: `$4` the history's start (epoch seconds),
/// `$5` the seconds between two rows' `created`, `$6` the workers to spread them over, `$7` to
/// `$10` the ids of `core.echo`, `core.noop`, `core.fail` and `core.flaky` (null if absent).
const LOAD_HISTORY: &str = r#"
WITH g AS MATERIALIZED (
    SELECT i, nextval(pg_get_serial_sequence('execution', 'id')) AS id,
           CASE WHEN i % 100 < 60 THEN 'echo'
                WHEN i % 100 < 84 THEN 'noop'
                WHEN i % 100 < 94 THEN 'fail'
                WHEN i % 2 = 0 AND i + 1 < $3 THEN 'flaky'
                WHEN i % 2 = 1 THEN 'retry'
                ELSE 'noop' END AS kind
    FROM generate_series($1::bigint, $2::bigint - 1) AS i
), w AS (
    SELECT g.*, lag(id) OVER (ORDER BY i) AS prev_id,
           to_timestamp($4::float8) + make_interval(secs => i * $5::float8) AS at,
           (i * 7919) % 997 AS j,
           ((i - 1) * 7919) % 997 AS prev_j
    FROM g
), t AS (
    -- a retry's original (the row before it) ended its scheduling delay and its run after it was created
    SELECT w.*,
           CASE WHEN kind = 'retry'
                THEN at - make_interval(secs => $5::float8) + (5 + prev_j % 20 + prev_j % 10) * interval '1 ms'
           END AS original_finished
    FROM w
), u AS (
    SELECT t.*,
           CASE WHEN kind = 'retry' THEN original_finished + interval '2 ms' ELSE at END AS created_at,
           CASE WHEN kind = 'retry' THEN original_finished + (1000 + j % 200) * interval '1 ms' END AS due
    FROM t
), v AS (
    SELECT u.*, coalesce(due, created_at) + (2 + j % 20) * interval '1 ms' AS started_at,
           (CASE kind WHEN 'noop' THEN 1 ELSE 3 + j % 10 END) * interval '1 ms' AS run
    FROM u
)
INSERT INTO execution (id, action, action_ref, runtime, parameters, config, status, worker, result, failure_kind,
    error, exit_code, stdout, stderr, retry_count, max_retries, retry_reason, original_execution, not_before,
    timeout_seconds, started, finished, created, updated, idempotency_key)
SELECT id,
    CASE kind WHEN 'echo' THEN $7::bigint WHEN 'noop' THEN $8::bigint WHEN 'fail' THEN $9::bigint ELSE $10::bigint END,
    CASE kind WHEN 'echo' THEN 'core.echo' WHEN 'noop' THEN 'core.noop' WHEN 'fail' THEN 'core.fail' ELSE 'core.flaky' END,
    CASE kind WHEN 'noop' THEN 'builtin' ELSE 'shell' END,
    CASE kind WHEN 'echo' THEN jsonb_build_object('message', 'hello ' || i)
              WHEN 'fail' THEN '{"exit_code": 1}'::jsonb
              WHEN 'noop' THEN '{}'::jsonb
              ELSE '{"fail_times": 1}'::jsonb END,
    CASE kind WHEN 'retry' THEN jsonb_build_object('max_retries', 3, 'retry_count', 1, 'retry_of', prev_id,
                                                   'original_execution', prev_id, 'retry_reason', 'transient_error')
              WHEN 'flaky' THEN '{"max_retries": 3, "retry_count": 0}'::jsonb
              ELSE '{"max_retries": 0, "retry_count": 0}'::jsonb END,
    (CASE WHEN kind IN ('fail', 'flaky') THEN 'failed'
          ELSE 'completed' END)::execution_status,
    ($6::bigint[])[1 + i % greatest(cardinality($6::bigint[]), 1)],
    CASE kind WHEN 'echo' THEN jsonb_build_object('stdout', 'hello ' || i || E'\n') END,
    CASE kind WHEN 'fail' THEN 'action_failed' WHEN 'flaky' THEN 'transient_error' END,
    CASE kind WHEN 'fail' THEN 'the action exited with code 1'
              WHEN 'flaky' THEN 'the action reported a transient failure (exit code 75)' END,
    CASE kind WHEN 'fail' THEN 1 WHEN 'flaky' THEN 75 ELSE 0 END,
    CASE kind WHEN 'echo' THEN 'hello ' || i || E'\n' WHEN 'retry' THEN E'attempt 1: done\n' ELSE '' END,
    CASE kind WHEN 'fail' THEN E'failing on purpose\n' WHEN 'flaky' THEN E'attempt 0: temporary failure\n' ELSE '' END,
    CASE kind WHEN 'retry' THEN 1 ELSE 0 END,
    CASE WHEN kind IN ('flaky', 'retry') THEN 3 ELSE 0 END,
    CASE kind WHEN 'retry' THEN 'transient_error' END,
    CASE kind WHEN 'retry' THEN prev_id END,
    due,
    CASE WHEN kind IN ('noop', 'fail') THEN 300 ELSE 30 END,
    started_at,
    started_at + run,
    created_at,
    started_at + run,
    -- one key per chain, as attune gives a retry its original's
    md5('attune-bench history ' || $4::float8 || ' ' || CASE kind WHEN 'retry' THEN i - 1 ELSE i END)::uuid::text
FROM v
"#;

/// Inserts rows `from` to `to - 1` of the finished executions `load` describes, in one
/// statement and one transaction: by position in each run of 100 rows, 60 `core.echo` completed,
/// 24 `core.noop` completed, 10 `core.fail` failed (`action_failed`) and 3 retry chains of
/// `core.flaky` (an original failed with `transient_error`, then its retry, completed). Ids come
/// from the table's sequence; `created` steps by `load.step_secs` from `load.start_epoch`. A chunk
/// should start at a multiple of 100 so that it never splits a chain. Returns the rows inserted.
pub async fn load_history_chunk(db: &PgPool, load: &HistoryLoad<'_>, from: i64, to: i64) -> Result<u64, sqlx::Error> {
    let mut tx = db.begin().await?;
    // (the window over the chunk's positions sorts in memory)
    sqlx::query("SET LOCAL work_mem = '64MB'").execute(&mut *tx).await?;
    sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
    let inserted = sqlx::query(LOAD_HISTORY)
        .bind(from)
        .bind(to)
        .bind(load.rows)
        .bind(load.start_epoch)
        .bind(load.step_secs)
        .bind(load.workers)
        .bind(load.actions[0])
        .bind(load.actions[1])
        .bind(load.actions[2])
        .bind(load.actions[3])
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(inserted)
}

/// `VACUUM ANALYZE execution`: after a load, the table's visibility map and statistics.
pub async fn vacuum_analyze_execution(db: &PgPool) -> Result<(), sqlx::Error> {
    // (no statement limit: minutes at 10 million rows)
    let mut connection = db.acquire().await?;
    sqlx::query("SET statement_timeout = 0").execute(&mut *connection).await?;
    let vacuumed = sqlx::query("VACUUM ANALYZE execution").execute(&mut *connection).await.map(|_| ());
    super::restore_limits(&mut connection).await?;
    vacuumed
}

/// Whether the schema has `execution_rollup_rebuild()` (the statistics' rollups).
pub async fn rollup_rebuild_exists(db: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'execution_rollup_rebuild')")
        .fetch_one(db)
        .await
}

/// Rebuilds the statistics' rollups from the execution table (`execution_rollup_rebuild()`),
/// which a load behind the services' back leaves stale.
pub async fn rollup_rebuild(db: &PgPool) -> Result<(), sqlx::Error> {
    let mut connection = db.acquire().await?;
    sqlx::query("SET statement_timeout = 0").execute(&mut *connection).await?;
    let rebuilt = sqlx::query("SELECT execution_rollup_rebuild()").execute(&mut *connection).await.map(|_| ());
    super::restore_limits(&mut connection).await?;
    rebuilt
}

/// The newest retry of `core.flaky` (retry count 1, with an original) created at or before
/// `created_by` (epoch seconds).
pub async fn newest_flaky_retry(db: &PgPool, created_by: f64) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM execution WHERE action_ref = 'core.flaky' AND retry_count = 1 \
         AND original_execution IS NOT NULL AND created <= to_timestamp($1) \
         ORDER BY created DESC LIMIT 1",
    )
    .bind(created_by)
    .fetch_optional(db)
    .await
}

/// The newest retry (an execution with an original), by id.
pub async fn newest_retry(db: &PgPool) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM execution WHERE original_execution IS NOT NULL ORDER BY id DESC LIMIT 1")
        .fetch_optional(db)
        .await
}

/// The newest execution, by id (`None`: the table is empty).
pub async fn newest_execution(db: &PgPool) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT max(id) FROM execution").fetch_one(db).await
}

/// The root of the retry chain `id` belongs to (the attempt without an original), if `id` exists.
pub async fn chain_root(db: &PgPool, id: i64) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH RECURSIVE up AS (SELECT id, original_execution FROM execution WHERE id = $1 \
         UNION ALL SELECT e.id, e.original_execution FROM execution e JOIN up ON e.id = up.original_execution) \
         SELECT id FROM up WHERE original_execution IS NULL LIMIT 1",
    )
    .bind(id)
    .fetch_optional(db)
    .await
}

/// The quick reference's Example 1, "View Retry Chain", verbatim: the chain rooted at execution 100
/// (run by [`quick_reference_example_1`] with the root bound in place of `100`).
pub const QUICK_REFERENCE_EXAMPLE_1: &str = "WITH RECURSIVE retry_chain AS (
SELECT id, retry_count, retry_reason, original_execution, status
FROM execution
WHERE id = 100
UNION ALL
SELECT e.id, e.retry_count, e.retry_reason, e.original_execution, e.status
FROM execution e
JOIN retry_chain rc ON e.original_execution = rc.id
)
SELECT * FROM retry_chain ORDER BY retry_count;";

/// The quick reference's Example 2, "Analyze Retry Success Rate", verbatim.
pub const QUICK_REFERENCE_EXAMPLE_2: &str = "SELECT
config->>'retry_reason' as reason,
COUNT(*) as total_retries,
COUNT(CASE WHEN status = 'completed' THEN 1 END) as succeeded,
ROUND(100.0 * COUNT(CASE WHEN status = 'completed' THEN 1 END) / COUNT(*), 2) as success_rate
FROM execution
WHERE retry_count > 0
GROUP BY config->>'retry_reason'
ORDER BY total_retries DESC;";

/// The quick reference's Example 3, "Find Workers by Health", verbatim.
pub const QUICK_REFERENCE_EXAMPLE_3: &str = "SELECT
w.name,
w.status,
(w.capabilities->'health'->>'status')::TEXT as health,
(w.capabilities->'health'->>'queue_depth')::INTEGER as queue,
(w.capabilities->'health'->>'consecutive_failures')::INTEGER as failures,
w.last_heartbeat
FROM worker w
WHERE w.status = 'active'
ORDER BY
CASE (w.capabilities->'health'->>'status')::TEXT
WHEN 'healthy' THEN 1
WHEN 'degraded' THEN 2
WHEN 'unhealthy' THEN 3
ELSE 4
END,
(w.capabilities->'health'->>'queue_depth')::INTEGER;";

/// The quick reference's monitoring query "Retry rate over last hour", verbatim.
pub const RETRY_RATE_LAST_HOUR: &str = "SELECT
COUNT(DISTINCT CASE WHEN retry_count = 0 THEN id END) as original_executions,
COUNT(DISTINCT CASE WHEN retry_count > 0 THEN id END) as retry_executions,
ROUND(100.0 * COUNT(DISTINCT CASE WHEN retry_count > 0 THEN id END) /
COUNT(DISTINCT CASE WHEN retry_count = 0 THEN id END), 2) as retry_rate
FROM execution
WHERE created > NOW() - INTERVAL '1 hour';";

/// The quick reference's monitoring query "Worker health distribution", verbatim.
pub const WORKER_HEALTH_DISTRIBUTION: &str = "SELECT
COALESCE((capabilities->'health'->>'status')::TEXT, 'unknown') as health_status,
COUNT(*) as worker_count,
AVG((capabilities->'health'->>'queue_depth')::INTEGER) as avg_queue_depth
FROM worker
WHERE status = 'active'
GROUP BY health_status;";

/// Runs the quick reference's Example 1 ([`QUICK_REFERENCE_EXAMPLE_1`]) for the chain rooted at
/// `root`: the statement as written but for its `100`, which becomes the bound parameter `$1`.
/// Returns the rows read.
pub async fn quick_reference_example_1(db: &PgPool, root: i64) -> Result<usize, sqlx::Error> {
    let statement = QUICK_REFERENCE_EXAMPLE_1.replacen("WHERE id = 100", "WHERE id = $1", 1);
    let rows = sqlx::query(sqlx::AssertSqlSafe(statement)).bind(root).fetch_all(db).await?;
    Ok(rows.len())
}

/// Runs the quick reference's Example 2 ([`QUICK_REFERENCE_EXAMPLE_2`]), the retries' success
/// rate by reason, as written. Returns the rows read.
pub async fn quick_reference_example_2(db: &PgPool) -> Result<usize, sqlx::Error> {
    Ok(sqlx::raw_sql(QUICK_REFERENCE_EXAMPLE_2).fetch_all(db).await?.len())
}

/// Runs the quick reference's Example 3 ([`QUICK_REFERENCE_EXAMPLE_3`]), the active workers by
/// health, as written. Returns the rows read.
pub async fn quick_reference_example_3(db: &PgPool) -> Result<usize, sqlx::Error> {
    Ok(sqlx::raw_sql(QUICK_REFERENCE_EXAMPLE_3).fetch_all(db).await?.len())
}

/// Runs the quick reference's [`RETRY_RATE_LAST_HOUR`], the retry rate of the executions created
/// in the last hour, as written. Returns the rows read.
pub async fn retry_rate_last_hour(db: &PgPool) -> Result<usize, sqlx::Error> {
    Ok(sqlx::raw_sql(RETRY_RATE_LAST_HOUR).fetch_all(db).await?.len())
}

/// Runs the quick reference's [`WORKER_HEALTH_DISTRIBUTION`], the active workers counted by
/// health, as written. Returns the rows read.
pub async fn worker_health_distribution(db: &PgPool) -> Result<usize, sqlx::Error> {
    Ok(sqlx::raw_sql(WORKER_HEALTH_DISTRIBUTION).fetch_all(db).await?.len())
}

/// How many executions are not finished (waiting, running or delayed).
pub async fn unfinished(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM execution WHERE status <> ALL($1)")
        .bind(&attune_core::ExecutionStatus::TERMINAL[..])
        .fetch_one(db)
        .await
}

/// For the `events` workload: each (delivery, execution) the rule `rule` made for events whose
/// delivery id starts with `prefix`.
pub async fn rule_executions(db: &PgPool, rule: &str, prefix: &str) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.delivery, m.execution FROM event e JOIN event_match m ON m.event = e.id \
         WHERE m.rule = $1 AND m.execution IS NOT NULL AND e.delivery LIKE $2 || '%'",
    )
    .bind(rule)
    .bind(prefix)
    .fetch_all(db)
    .await
}

/// For the `events` workload: for each execution the rule `rule` made for events whose delivery
/// id starts with `prefix`, the milliseconds from the event's receipt to the execution's start
/// (`None` while it has not started).
pub async fn event_to_start_ms(db: &PgPool, rule: &str, prefix: &str) -> Result<Vec<Option<f64>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM x.started - e.received)::float8 * 1000 FROM event e \
         JOIN event_match m ON m.event = e.id JOIN execution x ON x.id = m.execution \
         WHERE m.rule = $1 AND e.delivery LIKE $2 || '%'",
    )
    .bind(rule)
    .bind(prefix)
    .fetch_all(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_1_binds_the_root_in_place_of_100() {
        let statement = QUICK_REFERENCE_EXAMPLE_1.replacen("WHERE id = 100", "WHERE id = $1", 1);
        assert!(statement.contains("WHERE id = $1\n"));
        assert!(!statement.contains("100"));
    }
}
