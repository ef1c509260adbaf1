//! The API's reads and writes of executions: submissions (one, or a batch, keyed so that an
//! answer lost with the connection is read back, never written twice), the lists and summaries
//! of the read routes, chains and attempts, and the selections of bulk operations.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgExecutor, PgPool};

use attune_core::failure::FailureKind;
use attune_core::status::ExecutionStatus;

use super::{COLUMNS, Execution, NewExecution, Patience, Submitter, chain_walk, patiently};

/// The status of execution `id`; `None` when there is no such execution.
pub async fn status_of(db: impl PgExecutor<'_>, id: i64) -> Result<Option<ExecutionStatus>, sqlx::Error> {
    sqlx::query_scalar("SELECT status FROM execution WHERE id = $1").bind(id).fetch_optional(db).await
}

/// A new chain key for each of `news`, which must all be first submissions (`requested`, no
/// parent, no chain key of their own, no schedule's occurrence: the batch insert writes none).
fn first_submission_keys(news: &[(&NewExecution, &Submitter)]) -> Vec<String> {
    debug_assert!(news.iter().all(|(new, _)| new.status == ExecutionStatus::Requested
        && new.original_execution.is_none()
        && new.idempotency_key.is_none()
        && new.occurrence.is_none()));
    news.iter().map(|_| draw_chain_key()).collect()
}

/// Inserts many first submissions in one statement (one commit for them all), each with the token
/// that submitted it; the rows come back in the order given. Each must be a first attempt
/// (`requested`, no parent, no chain key of its own, no schedule's occurrence): retries, keyed
/// submissions and a schedule's runs are inserted one at a time.
///
/// Each row's chain key is drawn here, before the insert, so that with `Patience::Surely` (as the
/// API writes: a submission answered as failed must not have been written) an attempt in doubt
/// reads the rows back by their keys, once no batch insert that started before the read-back
/// still runs on the server (the lost one may: cut off while it waited for a lock), and inserts
/// only those absent. A row is never written twice; any other error is a refusal of the one
/// statement, which wrote nothing.
pub async fn insert_many_submitted(
    db: &PgPool,
    news: &[(&NewExecution, &Submitter)],
    patience: Patience,
) -> Result<Vec<Execution>, sqlx::Error> {
    let keys = first_submission_keys(news);
    let started = std::time::Instant::now();
    patiently(db, "inserting submissions", 0, patience, |mut connection, doubt| {
        let keys = &keys;
        async move {
            let answer = match doubt {
                true => landed_or_insert(&mut connection, news, keys, started.elapsed()).await,
                false => insert_many_keyed(&mut *connection, news, keys).await,
            };
            (connection, answer)
        }
    })
    .await
}

/// The route a batched submission's audit row names (`POST` there, answered `201`).
pub const SUBMISSION_ROUTE: &str = "/api/v1/executions";

/// Starts the text of the batch insert, so that `pg_stat_activity` shows which statements are one.
const SUBMISSIONS_MARK: &str = "/* attune: insert submissions */";

/// A chain key as the database draws one (`gen_random_uuid()::text`: a version 4 UUID), drawn
/// by the caller so that it knows the key before the row is written.
fn draw_chain_key() -> String {
    let random: u128 = rand::random();
    let uuid = (random & !(0xf000u128 << 64) & !(0xc000u128 << 48)) | (0x4000u128 << 64) | (0x8000u128 << 48);
    let hex = format!("{uuid:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The batch insert itself: `news` with their chain keys `keys`, in one statement.
async fn insert_many_keyed(
    db: impl PgExecutor<'_>,
    news: &[(&NewExecution, &Submitter)],
    keys: &[String],
) -> Result<Vec<Execution>, sqlx::Error> {
    let column = |field: &dyn Fn(&NewExecution) -> Value| news.iter().map(|(new, _)| field(new)).collect::<Vec<_>>();
    // the audit rows of the submissions that ask for one, in the same statement: one commit for
    // a submission and the record of who asked for it (`attune_api::audit`)
    let sql = format!(
        "{SUBMISSIONS_MARK} WITH ins AS (INSERT INTO execution (action, action_ref, parameters, config, status, max_retries, \
            timeout_seconds, retry_count, runtime, submitted_by, idempotency_key, trace_parent) \
         SELECT action, action_ref, parameters, config, 'requested', max_retries, timeout_seconds, retry_count, \
            runtime, submitted_by, idempotency_key, trace_parent \
         FROM unnest($1::bigint[], $2::text[], $3::jsonb[], $4::jsonb[], $5::int[], $6::int[], $7::int[], \
            $8::text[], $9::bigint[], $10::text[], $11::text[]) WITH ORDINALITY \
            AS n(action, action_ref, parameters, config, max_retries, timeout_seconds, retry_count, runtime, \
               submitted_by, idempotency_key, trace_parent, ord) \
         ORDER BY ord \
         RETURNING {COLUMNS}), \
         audited AS (INSERT INTO audit_event (token_id, role, method, route, path, status, target, reason) \
            SELECT ins.submitted_by, a.role, 'POST', '{SUBMISSION_ROUTE}', '{SUBMISSION_ROUTE}', 201, \
                'execution:' || ins.id, a.reason \
            FROM ins JOIN unnest($12::text[], $13::text[], $14::text[]) AS a(key, role, reason) \
                ON a.key = ins.idempotency_key \
            WHERE a.role IS NOT NULL) \
         SELECT * FROM ins"
    );
    let mut rows: Vec<Execution> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(news.iter().map(|(new, _)| new.action).collect::<Vec<_>>())
        .bind(news.iter().map(|(new, _)| new.action_ref.clone()).collect::<Vec<_>>())
        .bind(column(&|new| new.parameters.clone()))
        .bind(column(&|new| new.recorded_config()))
        .bind(news.iter().map(|(new, _)| new.max_retries).collect::<Vec<_>>())
        .bind(news.iter().map(|(new, _)| new.timeout_seconds).collect::<Vec<_>>())
        .bind(news.iter().map(|(new, _)| new.retry_count).collect::<Vec<_>>())
        .bind(news.iter().map(|(new, _)| new.runtime.clone()).collect::<Vec<_>>())
        .bind(news.iter().map(|(_, by)| by.token).collect::<Vec<_>>())
        .bind(keys)
        .bind(news.iter().map(|(new, _)| new.trace_parent.clone()).collect::<Vec<_>>())
        .bind(keys)
        .bind(news.iter().map(|(_, by)| by.audited.as_ref().map(|asked| asked.role.clone())).collect::<Vec<_>>())
        .bind(news.iter().map(|(_, by)| by.audited.as_ref().and_then(|asked| asked.reason.clone())).collect::<Vec<_>>())
        .fetch_all(db)
        .await?;
    // the ids come from one sequence in insertion order (`ORDER BY ord`): sorting by id restores it
    rows.sort_by_key(|row| row.id);
    Ok(rows)
}

/// After an attempt whose outcome is unknown: the rows of `keys` that landed, and the others
/// inserted now, in the order given. Waits first until every batch insert that had started by now
/// has ended (on a poll from 10 ms doubling to 1 s), so that the lost one cannot commit after the
/// look. The look is bounded to rows created since the first attempt (with a minute's slack), so
/// that it reads the recent end of `created`'s index, not the whole table.
async fn landed_or_insert(
    db: &mut sqlx::PgConnection,
    news: &[(&NewExecution, &Submitter)],
    keys: &[String],
    since_first_attempt: std::time::Duration,
) -> Result<Vec<Execution>, sqlx::Error> {
    let looked_at: DateTime<Utc> = crate::db::now(&mut *db).await?;
    let mut delay = std::time::Duration::from_millis(10);
    loop {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' \
             AND query_start < $1 AND starts_with(query, $2)",
        )
        .bind(looked_at)
        .bind(SUBMISSIONS_MARK)
        .fetch_one(&mut *db)
        .await?;
        if running == 0 {
            break;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(1));
    }
    let landed: Vec<Execution> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM execution WHERE created >= now() - make_interval(secs => $1) \
         AND idempotency_key = ANY($2) AND original_execution IS NULL"
    )))
    .bind(since_first_attempt.as_secs_f64() + 60.0)
    .bind(keys)
    .fetch_all(&mut *db)
    .await?;
    let (absent, absent_keys): (Vec<_>, Vec<_>) = news
        .iter()
        .zip(keys)
        .filter(|(_, key)| !landed.iter().any(|row| &row.idempotency_key == *key))
        .map(|(new, key)| (*new, key.clone()))
        .unzip();
    tracing::warn!(
        landed = landed.len(),
        absent = absent.len(),
        "a batch of submissions may have lost its acknowledgement: read back by their keys"
    );
    let inserted = if absent.is_empty() { Vec::new() } else { insert_many_keyed(db, &absent, &absent_keys).await? };
    let mut rows: std::collections::HashMap<String, Execution> =
        landed.into_iter().chain(inserted).map(|row| (row.idempotency_key.clone(), row)).collect();
    keys.iter()
        .map(|key| rows.remove(key))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| sqlx::Error::Protocol("a batch of submissions read back other rows than it wrote".into()))
}

/// Records that the API token `token` ended execution `id` by hand (a cancel, an operator's fail),
/// in the transaction of the transition that ended it.
pub async fn record_ended_by(db: impl PgExecutor<'_>, id: i64, token: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution SET ended_by = $2 WHERE id = $1").bind(id).bind(token).execute(db).await?;
    Ok(())
}

/// Why execution `id` waits, while it does (`execution_waiting`, migration
/// `20261208000200_execution_waiting.sql`): `{reason, message, ...}`; `None` when it does not.
pub async fn waiting(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Value>, sqlx::Error> {
    sqlx::query_scalar("SELECT execution_waiting($1)").bind(id).fetch_one(db).await
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<ExecutionStatus>,
    pub action_ref: Option<String>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only executions with a smaller id (the keyset cursor of the page before).
    pub before_id: Option<i64>,
    pub limit: i64,
    pub offset: i64,
}

/// The most a list page counts of the executions matching its filter: `total` is exact up to
/// here, and past it says "at least this many" (counting them all would read history).
pub const LIST_TOTAL_CAP: i64 = 10_000;

/// `{select} FROM execution WHERE <the filter's conditions>`, with only the conditions
/// the filter has (each bound), so the planner sees which index serves them: the status's or
/// the action's (both keyed by id, walked newest first), or the primary key.
fn filtered(select: String, filter: &ListFilter, with_cursor: bool) -> sqlx::QueryBuilder<sqlx::Postgres> {
    let mut query = sqlx::QueryBuilder::new(format!("{select} FROM execution WHERE true"));
    if let Some(status) = filter.status {
        query.push(" AND status = ").push_bind(status);
    }
    if let Some(action_ref) = &filter.action_ref {
        query.push(" AND action_ref = ").push_bind(action_ref.as_str());
    }
    if let Some(after) = filter.created_after {
        query.push(" AND created >= ").push_bind(after);
    }
    if let Some(before) = filter.created_before {
        query.push(" AND created < ").push_bind(before);
    }
    if let (true, Some(id)) = (with_cursor, filter.before_id) {
        query.push(" AND id < ").push_bind(id);
    }
    query
}

/// The page's rows, newest first: `limit` of them after `offset` (and before the cursor).
fn page(columns: &str, filter: &ListFilter) -> sqlx::QueryBuilder<sqlx::Postgres> {
    let mut query = filtered(format!("SELECT {columns}"), filter, true);
    query.push(" ORDER BY id DESC LIMIT ").push_bind(filter.limit).push(" OFFSET ").push_bind(filter.offset);
    query
}

/// Newest first. Returns the page and the number of matching executions, counted up to one
/// past [`LIST_TOTAL_CAP`].
pub async fn list(db: &PgPool, filter: &ListFilter) -> Result<(Vec<Execution>, i64), sqlx::Error> {
    let rows = page(COLUMNS, filter).build_query_as().fetch_all(db).await?;
    Ok((rows, list_total(db, filter).await?))
}

/// The number of executions matching `filter` (its cursor, limit and offset aside), counted up
/// to one past [`LIST_TOTAL_CAP`].
async fn list_total(db: &PgPool, filter: &ListFilter) -> Result<i64, sqlx::Error> {
    let mut query = filtered("SELECT count(*) FROM (SELECT 1".to_string(), filter, false);
    // one past the cap tells "exactly the cap" from "more"
    query.push(" LIMIT ").push_bind(LIST_TOTAL_CAP + 1).push(") AS matching");
    query.build_query_scalar().fetch_one(db).await
}

/// An execution without its heavy fields (`parameters`, `config`, `result`, `stdout`, `stderr`,
/// `retry_decision`): a row of a light list page, a few hundred bytes whatever the action did.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
// (this documents `additionalProperties: false`, which tells a summary row from a whole
// `Execution` in a page's schema; read by the CLI, it also refuses a field a newer server adds)
#[serde(deny_unknown_fields)]
pub struct ExecutionSummary {
    pub id: i64,
    pub action: Option<i64>,
    pub action_ref: String,
    /// The runtime of its action when it was submitted.
    pub runtime: Option<String>,
    pub status: ExecutionStatus,
    pub worker: Option<i64>,
    pub failure_kind: Option<FailureKind>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub retry_count: i32,
    pub max_retries: Option<i32>,
    pub retry_reason: Option<String>,
    pub original_execution: Option<i64>,
    pub not_before: Option<DateTime<Utc>>,
    pub timeout_seconds: Option<i32>,
    pub started: Option<DateTime<Utc>>,
    pub finished: Option<DateTime<Utc>>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
    /// The HTTP status an `http` action got.
    pub http_status: Option<i32>,
    /// The same for every attempt of a retry chain.
    pub idempotency_key: String,
    /// The API token that submitted it (see `Execution::submitted_by`).
    pub submitted_by: Option<i64>,
    /// The API token that ended it by hand, if one did.
    pub ended_by: Option<i64>,
    /// Its retry, once one was made: a failure with one is handled, one without is open.
    pub retried_by: Option<i64>,
}

const SUMMARY_COLUMNS: &str = "id, action, action_ref, runtime, status, worker, failure_kind, error, exit_code, \
    retry_count, max_retries, retry_reason, original_execution, not_before, timeout_seconds, started, finished, \
    created, updated, http_status, idempotency_key, submitted_by, ended_by, \
    (SELECT r.id FROM execution r WHERE r.original_execution = execution.id) AS retried_by";

/// `list` without the heavy fields: the page (newest first) and the total (see `list`).
pub async fn list_summaries(db: &PgPool, filter: &ListFilter) -> Result<(Vec<ExecutionSummary>, i64), sqlx::Error> {
    let rows = page(SUMMARY_COLUMNS, filter).build_query_as().fetch_all(db).await?;
    Ok((rows, list_total(db, filter).await?))
}

/// The bytes of the heavy fields (and `error`) of each row `list` would return, in its order,
/// as PostgreSQL writes them as text: what a full page of them weighs, read without sending
/// them (a text column's length is read from its header, not its value).
pub async fn list_sizes(db: &PgPool, filter: &ListFilter) -> Result<Vec<i64>, sqlx::Error> {
    page(
        "(octet_length(parameters::text) + octet_length(config::text) \
            + coalesce(octet_length(result::text), 0) + coalesce(octet_length(retry_decision::text), 0) \
            + coalesce(octet_length(stdout), 0) + coalesce(octet_length(stderr), 0) \
            + coalesce(octet_length(error), 0))::bigint",
        filter,
    )
    .build_query_scalar()
    .fetch_all(db)
    .await
}

/// Locks, for the rest of the transaction, those of the executions `ids` that no one else holds
/// now, in id order and without waiting (`SKIP LOCKED`): the ids it could lock. A change of many
/// rows that takes its locks this way neither waits behind a worker's or an executor's write nor
/// deadlocks with one that locks in another order.
pub async fn lock_free(db: impl PgExecutor<'_>, ids: &[i64]) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM execution WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED")
        .bind(ids)
        .fetch_all(db)
        .await
}

/// One attempt of a retry chain as the walk finds it: its id and what its fields weigh, as
/// `list_sizes` weighs them: all the heavy ones, and those a light attempt keeps (`error` and
/// `retry_decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct ChainLink {
    pub id: i64,
    pub full_bytes: i64,
    pub light_bytes: i64,
}

/// The attempts of the retry chain `execution_id` belongs to, first attempt first, weighed in
/// the database without sending their fields (empty when there is no such execution).
pub async fn chain_links(db: impl PgExecutor<'_>, execution_id: i64) -> Result<Vec<ChainLink>, sqlx::Error> {
    let select = "id, \
        (octet_length(parameters::text) + octet_length(config::text) \
            + coalesce(octet_length(result::text), 0) + coalesce(octet_length(retry_decision::text), 0) \
            + coalesce(octet_length(stdout), 0) + coalesce(octet_length(stderr), 0) \
            + coalesce(octet_length(error), 0))::bigint AS full_bytes, \
        (coalesce(octet_length(retry_decision::text), 0) + coalesce(octet_length(error), 0))::bigint AS light_bytes";
    let sql = format!("{} ORDER BY retry_count, id", chain_walk(select));
    sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(execution_id).fetch_all(db).await
}

/// The executions `ids`, whole, in retry order (`retry_count`, then id).
pub async fn attempts(db: impl PgExecutor<'_>, ids: &[i64]) -> Result<Vec<Execution>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM execution WHERE id = ANY($1) ORDER BY retry_count, id");
    sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(ids).fetch_all(db).await
}

/// A light attempt of a retry chain: the summary of its execution and what the RetryManager
/// decided for it (written by the executor, a few hundred bytes: what the chain is read for).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AttemptSummary {
    #[sqlx(flatten)]
    pub summary: ExecutionSummary,
    pub retry_decision: Option<Value>,
}

/// The executions `ids` without their heavy fields but with `retry_decision`, in retry order.
pub async fn attempt_summaries(db: impl PgExecutor<'_>, ids: &[i64]) -> Result<Vec<AttemptSummary>, sqlx::Error> {
    let sql =
        format!("SELECT {SUMMARY_COLUMNS}, retry_decision FROM execution WHERE id = ANY($1) ORDER BY retry_count, id");
    sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(ids).fetch_all(db).await
}

/// When each of the executions `ids` finished (null while unfinished), in no order.
pub async fn finished_times(
    db: impl PgExecutor<'_>,
    ids: &[i64],
) -> Result<Vec<(i64, Option<DateTime<Utc>>)>, sqlx::Error> {
    sqlx::query_as("SELECT id, finished FROM execution WHERE id = ANY($1)").bind(ids).fetch_all(db).await
}

/// What a bulk action does to each execution it selects (`select_for_bulk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// A manual retry of each finished execution that has none yet.
    Retry,
    /// A cancel of each unfinished one.
    Cancel,
    /// An operator's fail of each unfinished one but a delayed retry.
    Fail,
}

/// Which executions a bulk action looks at, besides what the action itself requires.
#[derive(Debug, Clone, Default)]
pub struct BulkFilter {
    pub status: Option<ExecutionStatus>,
    pub action_ref: Option<String>,
    pub failure_kind: Option<FailureKind>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only the attempts of the retry chain whose first attempt this is.
    pub chain_root: Option<i64>,
}

/// The executions `filter` selects that `action` applies to, oldest first, at most `limit`: for
/// a retry, failed ones (`failed`, `timeout`, `abandoned`; `completed` or `canceled` only when
/// the filter's status names it) not yet retried, so a second identical call selects none; for a
/// cancel or a fail, unfinished ones (a fail leaves a delayed retry alone).
pub async fn select_for_bulk(
    db: &PgPool,
    action: BulkAction,
    filter: &BulkFilter,
    limit: i64,
) -> Result<Vec<i64>, sqlx::Error> {
    let mut query = sqlx::QueryBuilder::new("SELECT e.id FROM execution e WHERE true");
    match action {
        // (a completed or canceled execution only when the filter names its status: a retry by
        // filter is for what failed)
        BulkAction::Retry => query
            .push(" AND e.status = ANY(")
            .push_bind(match filter.status {
                Some(status) if status.is_terminal() => vec![status],
                Some(_) => Vec::new(),
                None => vec![ExecutionStatus::Failed, ExecutionStatus::Timeout, ExecutionStatus::Abandoned],
            })
            .push(") AND NOT EXISTS (SELECT 1 FROM execution r WHERE r.original_execution = e.id)"),
        BulkAction::Cancel => {
            query.push(" AND NOT e.status = ANY(").push_bind(&ExecutionStatus::TERMINAL[..]).push(")")
        }
        BulkAction::Fail => query
            .push(" AND NOT e.status = ANY(")
            .push_bind(&ExecutionStatus::TERMINAL[..])
            .push(") AND e.status <> 'delayed'"),
    };
    if let Some(status) = filter.status {
        query.push(" AND e.status = ").push_bind(status);
    }
    if let Some(action_ref) = &filter.action_ref {
        query.push(" AND e.action_ref = ").push_bind(action_ref.clone());
    }
    if let Some(kind) = filter.failure_kind {
        query.push(" AND e.failure_kind = ").push_bind(kind);
    }
    if let Some(after) = filter.created_after {
        query.push(" AND e.created >= ").push_bind(after);
    }
    if let Some(before) = filter.created_before {
        query.push(" AND e.created < ").push_bind(before);
    }
    if let Some(root) = filter.chain_root {
        query
            .push(" AND e.id IN (WITH RECURSIVE down AS (SELECT id, 0 AS depth FROM execution WHERE id = ")
            .push_bind(root)
            .push(
                " UNION ALL SELECT c.id, down.depth + 1 FROM execution c JOIN down ON c.original_execution = down.id \
                   WHERE down.depth < 10000) SELECT id FROM down)",
            );
    }
    query.push(" ORDER BY e.id LIMIT ").push_bind(limit);
    query.build_query_scalar().fetch_all(db).await
}
