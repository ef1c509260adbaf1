//! The execution table: inserts, reads, and the guarded writes of `status`: `transition` for one
//! row, a worker's `claim` (which also reads what to run), and the batch claims (`claim_waiting`,
//! `promote_due_retries`), which check their edge against the state machine the same way.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor, PgPool};

use crate::db::Lent;

use attune_core::failure::FailureKind;
use attune_core::status::ExecutionStatus;

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Execution {
    pub id: i64,
    pub action: Option<i64>,
    pub action_ref: String,
    /// The runtime of its action when it was submitted: requests wait for a worker per runtime.
    pub runtime: Option<String>,
    /// As submitted, defaults filled in; a secret parameter is sealed in the record and shown
    /// `[redacted]` wherever an execution is serialized (`crate::secrets::shown`).
    #[schema(value_type = Object)]
    #[serde(serialize_with = "crate::secrets::serialize_shown")]
    pub parameters: Value,
    #[schema(value_type = Object)]
    pub config: Value,
    pub status: ExecutionStatus,
    pub worker: Option<i64>,
    /// The JSON object on the last line of the action's stdout, if any.
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub failure_kind: Option<FailureKind>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
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
    /// What the RetryManager decided when it failed, and why (`attune_core::retry::DecisionRecord`:
    /// `retried`, `rule`, `reason`, `failure_kind`, `retry_count`, `max_retries`, `delay_ms`,
    /// `next_attempt_at`, `policy`, `decided_at`); null when no decision was made.
    #[schema(value_type = Option<Object>)]
    pub retry_decision: Option<Value>,
    /// The HTTP status an `http` action got.
    pub http_status: Option<i32>,
    /// The same for every attempt of a retry chain (`ATTUNE_IDEMPOTENCY_KEY` to the action).
    pub idempotency_key: String,
    /// The API token (`api_token.id`) that submitted it; for a manual retry, the one that asked
    /// for the retry; an automatic retry keeps its parent's. Null when no token asked.
    pub submitted_by: Option<i64>,
    /// The API token that ended it by hand (a cancel, or an operator's fail); null otherwise.
    pub ended_by: Option<i64>,
    /// The W3C `traceparent` its spans hang under when traces are on (`attune_common::trace`):
    /// its submission's span, and for a retry the chain's first submission's. Its trace id finds
    /// the execution's trace in the tracing backend. Null with traces off.
    pub trace_parent: Option<String>,
    /// The schedule (`schedule.id`) whose run it is, and the occurrence it ran for; a retry keeps
    /// its parent's. Null when it was submitted.
    pub schedule: Option<i64>,
    pub scheduled_for: Option<DateTime<Utc>>,
    /// The workflow run (its execution's id) this is a step of, the step's name and the item
    /// (0 for a step without `with-items`); a retry keeps its parent's. Null outside workflows.
    pub workflow_run: Option<i64>,
    pub workflow_step: Option<String>,
    pub workflow_item: Option<i32>,
}

const COLUMNS: &str = "id, action, action_ref, runtime, parameters, config, status, worker, result, failure_kind, \
    error, exit_code, stdout, stderr, retry_count, max_retries, retry_reason, original_execution, \
    not_before, timeout_seconds, started, finished, created, updated, retry_decision, http_status, idempotency_key, \
    submitted_by, ended_by, trace_parent, schedule, scheduled_for, workflow_run, workflow_step, workflow_item";

#[derive(Debug, Clone)]
pub struct NewExecution {
    pub action: Option<i64>,
    pub action_ref: String,
    /// The action's runtime (`None`: the insert reads it from the action, at some cost).
    pub runtime: Option<String>,
    pub parameters: Value,
    pub config: Value,
    pub status: ExecutionStatus,
    pub max_retries: i32,
    pub timeout_seconds: i32,
    pub retry_count: i32,
    pub retry_reason: Option<String>,
    pub original_execution: Option<i64>,
    pub not_before: Option<DateTime<Utc>>,
    /// The chain's key: a retry's is its parent's; `None` draws a new one.
    pub idempotency_key: Option<String>,
    /// See `Execution::trace_parent` (a retry keeps its parent's).
    pub trace_parent: Option<String>,
}

/// How many retries of an execution's chain so far were paid by the platform's budget
/// (`config.platform_retries`, which only the RetryManager writes; `retry::PLATFORM_RETRIES`).
pub fn platform_retries(config: &Value) -> i64 {
    config.get("platform_retries").and_then(Value::as_i64).unwrap_or(0).clamp(0, i64::from(i32::MAX))
}

impl NewExecution {
    /// This retry was paid by the platform's budget (`retry::RetryDecision::Retry::paid_by_platform`).
    pub fn paid_by_platform(mut self, parent: &Execution) -> NewExecution {
        self.config["platform_retries"] = (platform_retries(&parent.config) + 1).into();
        self
    }
}

impl NewExecution {
    /// The new execution that retries `parent`: same action and parameters (unless replaced), the
    /// next retry count, the same retry budget, and the reason in both `retry_reason` and
    /// `config.retry_reason` (where the seed's queries read it).
    pub fn retry_of(
        parent: &Execution,
        status: ExecutionStatus,
        reason: FailureKind,
        parameters: Option<Value>,
        not_before: Option<DateTime<Utc>>,
    ) -> NewExecution {
        let mut config =
            if parent.config.is_object() { parent.config.clone() } else { Value::Object(Default::default()) };
        config["retry_reason"] = Value::String(reason.as_str().to_string());
        // (the chain's retries paid by the platform's budget so far: the RetryManager counts one
        // more on the retry it makes so, `paid_by_platform`)
        NewExecution {
            action: parent.action,
            action_ref: parent.action_ref.clone(),
            runtime: parent.runtime.clone(),
            parameters: parameters.unwrap_or_else(|| parent.parameters.clone()),
            config,
            status,
            max_retries: parent.max_retries.unwrap_or(0),
            timeout_seconds: parent.timeout_seconds.unwrap_or(300),
            retry_count: parent.retry_count + 1,
            retry_reason: Some(reason.as_str().to_string()),
            original_execution: Some(parent.id),
            not_before,
            idempotency_key: Some(parent.idempotency_key.clone()),
            trace_parent: parent.trace_parent.clone(),
        }
    }
}

impl NewExecution {
    /// The `config` stored with the execution: the client's, with the retry fields the seed's
    /// queries read from it set to what is in force (`SELECT config FROM execution WHERE id = 123`
    /// shows the budget): `max_retries` and `retry_count` always, and for a retry `retry_of`,
    /// `original_execution` and `retry_reason` (what a retry submitted as a new execution gives).
    pub fn recorded_config(&self) -> Value {
        let mut config = if self.config.is_object() { self.config.clone() } else { Value::Object(Default::default()) };
        config["max_retries"] = self.max_retries.into();
        config["retry_count"] = self.retry_count.into();
        match self.original_execution {
            Some(parent) => {
                config["retry_of"] = parent.into();
                config["original_execution"] = parent.into();
                if let Some(reason) = &self.retry_reason {
                    config["retry_reason"] = reason.as_str().into();
                }
            }
            None => {
                if let Value::Object(map) = &mut config {
                    // a first attempt retries nothing, whatever the client wrote
                    for key in ["retry_of", "original_execution", "retry_reason", "platform_retries"] {
                        map.remove(key);
                    }
                }
            }
        }
        config
    }
}

/// The status of execution `id`; `None` when there is no such execution.
pub async fn status_of(db: impl PgExecutor<'_>, id: i64) -> Result<Option<ExecutionStatus>, sqlx::Error> {
    sqlx::query_scalar("SELECT status FROM execution WHERE id = $1").bind(id).fetch_optional(db).await
}

/// Inserts `new` on no token's behalf (an automatic retry keeps its parent's `submitted_by`).
pub async fn insert(db: impl PgExecutor<'_>, new: &NewExecution) -> Result<Execution, sqlx::Error> {
    insert_submitted(db, new, None).await
}

/// Inserts the retry `new` (`NewExecution::retry_of`) through `execution_insert_retry`, which
/// copies the request (action, parameters, runtime, who asked) from the parent's row: the
/// executors' login inserts no execution of its own (issue 47). Only `new`'s status, wait, reason
/// and config are its own; a parent that has not ended without success is refused (`22023`).
pub async fn insert_retry(db: impl PgExecutor<'_>, new: &NewExecution) -> Result<Execution, sqlx::Error> {
    let Some(parent) = new.original_execution else {
        return Err(sqlx::Error::Protocol("insert_retry: a retry names its parent".into()));
    };
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM execution_insert_retry($1, $2, $3, $4, $5)")))
        .bind(parent)
        .bind(new.status)
        .bind(&new.retry_reason)
        .bind(new.not_before)
        .bind(new.recorded_config())
        .fetch_one(db)
        .await
}

/// Inserts `new`, submitted by the API token `submitted_by`; `None`: a retry's parent's.
pub async fn insert_submitted(
    db: impl PgExecutor<'_>,
    new: &NewExecution,
    submitted_by: Option<i64>,
) -> Result<Execution, sqlx::Error> {
    let sql = format!(
        "INSERT INTO execution (action, action_ref, parameters, config, status, max_retries, \
         timeout_seconds, retry_count, retry_reason, original_execution, not_before, runtime, idempotency_key, \
         submitted_by, trace_parent, schedule, scheduled_for, workflow_run, workflow_step, workflow_item) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, COALESCE($13, gen_random_uuid()::text), \
         COALESCE($14, parent.submitted_by), $15, parent.schedule, parent.scheduled_for, \
         parent.workflow_run, parent.workflow_step, parent.workflow_item \
         FROM (SELECT) AS one LEFT JOIN execution parent ON parent.id = $10 \
         RETURNING {COLUMNS}"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(new.action)
        .bind(&new.action_ref)
        .bind(&new.parameters)
        .bind(new.recorded_config())
        .bind(new.status)
        .bind(new.max_retries)
        .bind(new.timeout_seconds)
        .bind(new.retry_count)
        .bind(&new.retry_reason)
        .bind(new.original_execution)
        .bind(new.not_before)
        .bind(&new.runtime)
        .bind(&new.idempotency_key)
        .bind(submitted_by)
        .bind(&new.trace_parent)
        .fetch_one(db)
        .await
}

/// Who submitted a first attempt: the API token, and, when its request is to be audited in the
/// insert's own statement (one commit for both), the role and reason that `audit_event` records.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitter {
    pub token: i64,
    pub audited: Option<crate::db::audit::Asked>,
}

impl Submitter {
    /// A submitter whose request is audited elsewhere (or not at all).
    pub fn token(token: i64) -> Submitter {
        Submitter { token, audited: None }
    }
}

/// A new chain key for each of `news`, which must all be first submissions (`requested`, no
/// parent, no chain key of their own).
fn first_submission_keys(news: &[(&NewExecution, &Submitter)]) -> Vec<String> {
    debug_assert!(news.iter().all(|(new, _)| new.status == ExecutionStatus::Requested
        && new.original_execution.is_none()
        && new.idempotency_key.is_none()));
    news.iter().map(|_| draw_chain_key()).collect()
}

/// Inserts many first submissions in one statement (one commit for them all), each with the token
/// that submitted it; the rows come back in the order given. Each must be a first attempt
/// (`requested`, no parent, no chain key of its own): retries and keyed submissions are inserted
/// one at a time. (The API writes through `insert_many_submitted_surely`.)
pub async fn insert_many_submitted(
    db: impl PgExecutor<'_>,
    news: &[(&NewExecution, &Submitter)],
) -> Result<Vec<Execution>, sqlx::Error> {
    let keys = first_submission_keys(news);
    insert_many_keyed(db, news, &keys).await
}

/// `insert_many_submitted` as the API makes it: how it writes the submissions that arrived while
/// its previous write was in flight.
///
/// Sure of its answer, as the API must be (a submission answered as failed must not have been
/// written): each row's chain key is drawn here, before the insert. An error that may have come
/// after the commit (the connection lost: `db::is_transient`) is waited out (100 ms doubling to
/// 5 s), then the rows are read back by their keys, once no batch insert that started before the
/// read-back still runs on the server (the lost one may: cut off while it waited for a lock), and
/// only those absent are inserted. A row is never written twice; any other error is a refusal of
/// the one statement, which wrote nothing.
pub async fn insert_many_submitted_surely(
    db: &PgPool,
    news: &[(&NewExecution, &Submitter)],
) -> Result<Vec<Execution>, sqlx::Error> {
    let keys = first_submission_keys(news);
    let started = std::time::Instant::now();
    let tried = std::sync::atomic::AtomicBool::new(false);
    crate::db::retry_while_unavailable("inserting submissions", || {
        let uncertain = tried.swap(true, std::sync::atomic::Ordering::Relaxed);
        let keys = &keys;
        async move {
            match uncertain {
                true => landed_or_insert(db, news, keys, started.elapsed()).await,
                false => insert_many_keyed(db, news, keys).await,
            }
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
    db: &PgPool,
    news: &[(&NewExecution, &Submitter)],
    keys: &[String],
    since_first_attempt: std::time::Duration,
) -> Result<Vec<Execution>, sqlx::Error> {
    let looked_at: DateTime<Utc> = crate::db::now(db).await?;
    let mut delay = std::time::Duration::from_millis(10);
    loop {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' \
             AND query_start < $1 AND starts_with(query, $2)",
        )
        .bind(looked_at)
        .bind(SUBMISSIONS_MARK)
        .fetch_one(db)
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
    .fetch_all(db)
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

/// Keeps what a run printed before it was stopped by hand (a cancel, an operator's fail) in its
/// ended row: the worker `worker` that ran it, by the run's token, once
/// (`execution_stopped_output`). `false` when the row is not such a run.
pub async fn keep_stopped_output(
    db: impl PgExecutor<'_>,
    id: i64,
    worker: i64,
    run_token: Option<&str>,
    stdout: &str,
    stderr: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT execution_stopped_output($1, $2, $3, $4, $5)")
        .bind(id)
        .bind(worker)
        .bind(run_token)
        .bind(stdout)
        .bind(stderr)
        .fetch_one(db)
        .await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Execution>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM execution WHERE id = $1")))
        .bind(id)
        .fetch_optional(db)
        .await
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
// (serialized only: this documents `additionalProperties: false`, which tells a summary row
// from a whole `Execution` in a page's schema)
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

/// What a finished (or failed) execution records alongside its new status.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub result: Option<Value>,
    pub failure_kind: Option<FailureKind>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    /// The HTTP status an `http` action got.
    pub http_status: Option<i32>,
    /// How long the response asked to wait before the next attempt (`Retry-After`); not stored,
    /// read by the retry decision.
    pub retry_after: Option<std::time::Duration>,
}

impl Outcome {
    fn has_nul(&self) -> bool {
        let text = |s: &Option<String>| s.as_deref().is_some_and(|s| s.contains('\0'));
        text(&self.error) || text(&self.stdout) || text(&self.stderr) || self.result.as_ref().is_some_and(json_has_nul)
    }

    /// PostgreSQL stores no NUL character in TEXT or JSONB: replace them (U+FFFD) rather than fail
    /// on every delivery of an action's odd output.
    fn without_nul(&self) -> Outcome {
        let text = |s: &Option<String>| s.as_ref().map(|s| s.replace('\0', "\u{FFFD}"));
        let mut result = self.result.clone();
        if let Some(value) = result.as_mut() {
            strip_json_nul(value);
        }
        Outcome {
            result,
            failure_kind: self.failure_kind,
            error: text(&self.error),
            exit_code: self.exit_code,
            stdout: text(&self.stdout),
            stderr: text(&self.stderr),
            http_status: self.http_status,
            retry_after: self.retry_after,
        }
    }
}

fn json_has_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(json_has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || json_has_nul(v)),
        _ => false,
    }
}

fn strip_json_nul(value: &mut Value) {
    match value {
        Value::String(s) => *s = s.replace('\0', "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(strip_json_nul),
        Value::Object(map) => {
            let entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            for (key, mut v) in entries {
                strip_json_nul(&mut v);
                map.insert(key.replace('\0', "\u{FFFD}"), v);
            }
        }
        _ => {}
    }
}

/// One guarded status change.
#[derive(Debug, Clone)]
pub struct Transition<'a> {
    pub to: ExecutionStatus,
    /// The states it may come from; each must be an edge of the state machine.
    pub from: &'a [ExecutionStatus],
    /// Only if the execution belongs to this worker (fencing for worker-owned states).
    pub owned_by: Option<i64>,
    /// Assigns the execution to a worker (with `scheduled`).
    pub assign_worker: Option<i64>,
    pub outcome: Option<&'a Outcome>,
    /// The retry decision recorded with a failure (see `Execution::retry_decision`).
    pub retry_decision: Option<&'a Value>,
    /// Only if the execution's run token (drawn by the worker at its claim) is this one: how a
    /// result is recorded (`ExecutionResult::run_token`). `Some(None)` matches only a run claimed
    /// without a token (by a worker of an earlier version).
    pub run_token: Option<Option<&'a str>>,
}

impl<'a> Transition<'a> {
    /// A transition from every state the state machine allows.
    pub fn to(to: ExecutionStatus) -> Self {
        Transition {
            to,
            from: to.allowed_from(),
            owned_by: None,
            assign_worker: None,
            outcome: None,
            retry_decision: None,
            run_token: None,
        }
    }
    pub fn from(mut self, from: &'a [ExecutionStatus]) -> Self {
        self.from = from;
        self
    }
    pub fn owned_by(mut self, worker_id: i64) -> Self {
        self.owned_by = Some(worker_id);
        self
    }
    pub fn assign_worker(mut self, worker_id: i64) -> Self {
        self.assign_worker = Some(worker_id);
        self
    }
    pub fn outcome(mut self, outcome: &'a Outcome) -> Self {
        self.outcome = Some(outcome);
        self
    }
    pub fn retry_decision(mut self, decision: &'a Value) -> Self {
        self.retry_decision = Some(decision);
        self
    }
    /// Guards by the run token a result carries (`None`: it carries none).
    pub fn run_token(mut self, run_token: Option<&'a str>) -> Self {
        self.run_token = Some(run_token);
        self
    }

    /// scheduled → running for the worker it was dispatched to: its claim.
    pub fn claim(worker_id: i64) -> Self {
        Transition::to(ExecutionStatus::Running).from(&[ExecutionStatus::Scheduled]).owned_by(worker_id)
    }

    /// running → completed, with its outcome, for the worker that ran it.
    pub fn completion(worker_id: i64, outcome: &'a Outcome) -> Self {
        Transition::to(ExecutionStatus::Completed)
            .from(&[ExecutionStatus::Running])
            .owned_by(worker_id)
            .outcome(outcome)
    }

    /// scheduled → requested, fenced by the worker it was dispatched to (see `hand_back`).
    pub fn hand_back(worker_id: i64) -> Self {
        Transition::to(ExecutionStatus::Requested).from(&[ExecutionStatus::Scheduled]).owned_by(worker_id)
    }
}

/// What a transition on a hot path returns instead of the whole row: enough to count it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Changed {
    pub id: i64,
    pub status: ExecutionStatus,
    pub action_ref: String,
    pub retry_count: i32,
    pub worker: Option<i64>,
}

/// The rows a transition can return, with the columns each reads.
pub trait TransitionRow: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin {
    const COLUMNS: &'static str;
    fn changed(&self) -> (ExecutionStatus, &str, i32);
}

impl TransitionRow for Execution {
    const COLUMNS: &'static str = COLUMNS;
    fn changed(&self) -> (ExecutionStatus, &str, i32) {
        (self.status, &self.action_ref, self.retry_count)
    }
}

impl TransitionRow for Changed {
    const COLUMNS: &'static str = "id, status, action_ref, retry_count, worker";
    fn changed(&self) -> (ExecutionStatus, &str, i32) {
        (self.status, &self.action_ref, self.retry_count)
    }
}

/// The write path of `execution.status` for one row (besides `insert`, a worker's `claim` and the
/// batch claims `claim_waiting` and `promote_due_retries`, which check their edges the same way): one UPDATE
/// guarded by the allowed source states
/// (and the owning worker). `Ok(None)` means nothing matched: the message that asked for it was a
/// duplicate or is stale, and the caller acks and drops it. Returns the whole row.
pub async fn transition(
    db: impl PgExecutor<'_>,
    execution_id: i64,
    transition: &Transition<'_>,
) -> Result<Option<Execution>, sqlx::Error> {
    transition_as(db, execution_id, transition).await
}

/// `transition`, returning only `Changed` (no parameters, output or timestamps to send and decode):
/// for the worker's claim and the recording of a result, once per execution each.
pub async fn transition_brief(
    db: impl PgExecutor<'_>,
    execution_id: i64,
    transition: &Transition<'_>,
) -> Result<Option<Changed>, sqlx::Error> {
    transition_as(db, execution_id, transition).await
}

impl Transition<'_> {
    /// Panics unless every `from → to` is an edge of the state machine: a status change the
    /// state machine does not allow is a bug in the caller, caught before any SQL runs.
    fn check(&self) {
        for from in self.from {
            assert!(
                ExecutionStatus::can_transition(*from, self.to),
                "{from} -> {} is not an edge of the state machine",
                self.to
            );
        }
    }
}

async fn transition_as<R: TransitionRow>(
    db: impl PgExecutor<'_>,
    execution_id: i64,
    transition: &Transition<'_>,
) -> Result<Option<R>, sqlx::Error> {
    transition.check();
    let empty = Outcome::default();
    let given = transition.outcome.unwrap_or(&empty);
    let sanitized;
    let outcome = if given.has_nul() {
        sanitized = given.without_nul();
        &sanitized
    } else {
        given
    };
    let sql = format!(
        "UPDATE execution SET status = $2, updated = now(), \
            worker = CASE WHEN $2 = 'requested' THEN NULL ELSE COALESCE($4, worker) END, \
            started = CASE WHEN $2 = 'running' THEN now() ELSE started END, \
            finished = CASE WHEN $2 = ANY($12) THEN now() ELSE finished END, \
            result = COALESCE($6, result), failure_kind = COALESCE($7, failure_kind), \
            error = COALESCE($8, error), exit_code = COALESCE($9, exit_code), \
            stdout = COALESCE($10, stdout), stderr = COALESCE($11, stderr), \
            retry_decision = COALESCE($13, retry_decision), http_status = COALESCE($14, http_status) \
         WHERE id = $1 AND status = ANY($3) AND ($5::bigint IS NULL OR worker = $5) \
           AND (NOT $15 OR run_token IS NOT DISTINCT FROM $16) \
         RETURNING {}",
        R::COLUMNS
    );
    let applied: Option<R> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(execution_id)
        .bind(transition.to)
        .bind(transition.from)
        .bind(transition.assign_worker)
        .bind(transition.owned_by)
        .bind(&outcome.result)
        .bind(outcome.failure_kind)
        .bind(&outcome.error)
        .bind(outcome.exit_code)
        .bind(&outcome.stdout)
        .bind(&outcome.stderr)
        .bind(&ExecutionStatus::TERMINAL[..])
        .bind(transition.retry_decision)
        .bind(outcome.http_status)
        .bind(transition.run_token.is_some())
        .bind(transition.run_token.flatten())
        .fetch_optional(db)
        .await?;
    if let Some(row) = &applied {
        count_finished(row);
    }
    Ok(applied)
}

/// Counts a row a transition ended in the finished-executions metrics.
fn count_finished(row: &impl TransitionRow) {
    let (status, action_ref, retry_count) = row.changed();
    if !status.is_terminal() {
        return;
    }
    use crate::metrics::{EXECUTIONS_FINISHED, RETRIES_FINISHED, increment};
    increment(&EXECUTIONS_FINISHED, &[("status", status.as_str()), ("action", action_ref)], 1);
    if retry_count > 0 {
        let result = if status == ExecutionStatus::Completed { "succeeded" } else { "failed" };
        increment(&RETRIES_FINISHED, &[("result", result)], 1);
    }
}

/// `transition_brief` as the workers make it: waiting out a database outage, and sure of its
/// answer. An error may come after the server committed (the acknowledgement lost with the
/// connection): so when a later attempt finds nothing to change, the row is read, and if it is
/// already where this transition takes it (its target state, on the worker it fences by or
/// assigns), the earlier attempt landed and its row is the answer, not a stale message.
pub async fn transition_surely(
    db: &PgPool,
    what: &str,
    execution_id: i64,
    transition: &Transition<'_>,
) -> Result<Option<Changed>, sqlx::Error> {
    surely(db, what, execution_id, |mut connection, uncertain| async move {
        let answer = match uncertain {
            true => transition_or_landed(&mut connection, execution_id, transition).await,
            false => transition_brief(&mut *connection, execution_id, transition).await,
        };
        (connection, answer)
    })
    .await
}

/// Runs `attempt` on a connection of `db` until it answers other than with a passing outage,
/// backing off from 100 ms to 5 s; `attempt(connection, true)` once an earlier attempt failed,
/// and so may have landed unacknowledged. An attempt whose connection does not answer within
/// `db::answer_deadline` (half-open: the statement timeout plus 5 s) abandons that connection
/// (`db::answered_within`) and counts as a lost one: the next attempt goes out on another.
async fn surely<T, Fut>(
    db: &PgPool,
    what: &str,
    execution_id: i64,
    mut attempt: impl FnMut(Lent, bool) -> Fut,
) -> Result<Option<T>, sqlx::Error>
where
    Fut: std::future::Future<Output = (Lent, Result<Option<T>, sqlx::Error>)>,
{
    let deadline = crate::db::answer_deadline(db);
    let mut uncertain = false;
    let mut delay = std::time::Duration::from_millis(100);
    loop {
        let answer = crate::db::answered_within(db, deadline, |connection| attempt(connection, uncertain)).await;
        match answer {
            Err(e) if crate::db::is_transient(&e) => {
                uncertain = true;
                tracing::warn!(execution_id, error = %e, retry_in_ms = delay.as_millis() as u64, "{what}: dependency unavailable, waiting");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

/// A worker's claim: the run as the database names it, read in the claim's own statement. The
/// dispatch message names only the execution and the worker, and nothing else in it is believed.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ClaimedRun {
    pub id: i64,
    pub status: ExecutionStatus,
    pub action_ref: String,
    pub worker: Option<i64>,
    pub parameters: Value,
    pub timeout_seconds: Option<i32>,
    pub retry_count: i32,
    pub idempotency_key: String,
    /// The token the claim stored (see `claim`).
    pub run_token: Option<String>,
    /// See `Execution::trace_parent`.
    pub trace_parent: Option<String>,
    /// The action's runtime (`None`, like the four below, when the action is gone).
    pub runtime: Option<String>,
    pub entrypoint: Option<String>,
    /// The directory of the action's pack.
    pub pack_path: Option<String>,
    /// The action's `http` block.
    pub http: Option<Value>,
    /// The action's `retry` block (its `exit_codes` are transient).
    pub retry_policy: Option<Value>,
    /// The action's `limits` block, as written (the worker fills in and caps what it enforces).
    pub limits: Option<Value>,
    /// The claim counted it against a concurrency policy: ended by hand, it keeps its slot until
    /// its worker says its processes are gone (`release`).
    pub concurrency_limited: bool,
}

/// What a claim reads, from the claimed row `c`, its action `a` and the action's pack `p`.
const RUN_COLUMNS: &str = "c.id, c.status, c.action_ref, c.worker, c.parameters, c.timeout_seconds, c.retry_count, \
    c.idempotency_key, c.run_token, c.trace_parent, a.runtime, a.entrypoint, p.path AS pack_path, a.http, a.retry_policy, \
    a.limits, c.concurrency_limited FROM c LEFT JOIN action a ON a.id = c.action LEFT JOIN pack p ON p.id = a.pack";

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

/// scheduled → running for the worker the execution was dispatched to (`Transition::claim`),
/// storing `run_token` (drawn by that worker, see `ExecutionResult::run_token`), and what to run,
/// read from the execution, its action and the action's pack: one statement, one round trip.
/// `None`: the execution is not scheduled on this worker (a stale, duplicate or forged dispatch),
/// and nothing was written. The one-execution form of `claim_many_surely`, without its waiting.
pub async fn claim(
    db: impl PgExecutor<'_>,
    execution_id: i64,
    worker_id: i64,
    run_token: &str,
) -> Result<Option<ClaimedRun>, sqlx::Error> {
    Ok(claim_runs(db, &[execution_id], &[run_token], worker_id, false).await?.pop())
}

/// `claim` as `transition_surely` makes a transition: waiting out a database outage, and, when a
/// later attempt finds nothing to claim after an error, reading back the run an earlier attempt
/// claimed with this very token (its acknowledgement lost).
pub async fn claim_surely(
    db: &PgPool,
    execution_id: i64,
    worker_id: i64,
    run_token: &str,
) -> Result<Option<ClaimedRun>, sqlx::Error> {
    Ok(claim_many_surely(db, worker_id, &[(execution_id, run_token)]).await?.pop())
}

/// The batch form of `claim_surely`: scheduled → running on `worker_id` for each `(execution,
/// run token)` still dispatched there, in one statement, with what to run. Returns the runs it
/// claimed (the others were stale: canceled, handed back or taken elsewhere), in no set order.
/// Waits out a database outage; after one, a run an earlier attempt claimed with its very token is
/// read back as claimed (its acknowledgement was lost).
pub async fn claim_many_surely(
    db: &PgPool,
    worker_id: i64,
    claims: &[(i64, &str)],
) -> Result<Vec<ClaimedRun>, sqlx::Error> {
    let ids: Vec<i64> = claims.iter().map(|(id, _)| *id).collect();
    let tokens: Vec<&str> = claims.iter().map(|(_, token)| *token).collect();
    let first = ids.first().copied().unwrap_or_default();
    let claimed = surely(db, "claiming executions", first, |mut connection, uncertain| {
        let (ids, tokens) = (&ids, &tokens);
        async move {
            let answer = claim_runs(&mut *connection, ids, tokens, worker_id, uncertain).await.map(Some);
            (connection, answer)
        }
    })
    .await?;
    Ok(claimed.unwrap_or_default())
}

/// Every worker claim: the SQL function `claim_runs` (one guarded primary-key UPDATE per
/// execution) and what to run, in one statement. With `landed_too` (after an outage) a run
/// already claimed here with its token is read back as claimed.
async fn claim_runs(
    db: impl PgExecutor<'_>,
    ids: &[i64],
    tokens: &[&str],
    worker_id: i64,
    landed_too: bool,
) -> Result<Vec<ClaimedRun>, sqlx::Error> {
    // (what `claim_runs` does, checked against the state machine)
    Transition::claim(worker_id).check();
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH c AS (SELECT * FROM claim_runs($1, $2, $3, $4)) SELECT {RUN_COLUMNS}"
    )))
    .bind(ids)
    .bind(tokens)
    .bind(worker_id)
    .bind(landed_too)
    .fetch_all(db)
    .await
}

/// The outcomes of a batch of successes, each without the NUL characters PostgreSQL's text refuses.
fn without_nuls<'a>(done: &[(i64, &'a Outcome, Option<&str>)]) -> Vec<std::borrow::Cow<'a, Outcome>> {
    done.iter()
        .map(|(_, outcome, _)| match outcome.has_nul() {
            true => std::borrow::Cow::Owned(outcome.without_nul()),
            false => std::borrow::Cow::Borrowed(*outcome),
        })
        .collect()
}

/// A batch of successes as the first eight arguments of `complete_runs`, one array per column.
struct SuccessColumns<'a> {
    ids: Vec<i64>,
    tokens: Vec<Option<&'a str>>,
    results: Vec<Option<Value>>,
    errors: Vec<Option<&'a str>>,
    exit_codes: Vec<Option<i32>>,
    stdouts: Vec<Option<&'a str>>,
    stderrs: Vec<Option<&'a str>>,
    http_statuses: Vec<Option<i32>>,
}

impl<'a> SuccessColumns<'a> {
    fn of(done: &[(i64, &Outcome, Option<&'a str>)], outcomes: &'a [std::borrow::Cow<'_, Outcome>]) -> Self {
        SuccessColumns {
            ids: done.iter().map(|(id, _, _)| *id).collect(),
            tokens: done.iter().map(|(_, _, token)| *token).collect(),
            results: outcomes.iter().map(|o| o.result.clone()).collect(),
            errors: outcomes.iter().map(|o| o.error.as_deref()).collect(),
            exit_codes: outcomes.iter().map(|o| o.exit_code).collect(),
            stdouts: outcomes.iter().map(|o| o.stdout.as_deref()).collect(),
            stderrs: outcomes.iter().map(|o| o.stderr.as_deref()).collect(),
            http_statuses: outcomes.iter().map(|o| o.http_status).collect(),
        }
    }

    /// `query` with these bound as its first eight parameters.
    fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.tokens)
            .bind(&self.results)
            .bind(&self.errors)
            .bind(&self.exit_codes)
            .bind(&self.stdouts)
            .bind(&self.stderrs)
            .bind(&self.http_statuses)
    }
}

/// The batch form of recording successes (`Transition::completion` fenced by each run's token):
/// running → completed on `worker_id` for each `(execution, outcome, run token)`, in one
/// statement. Returns the rows it changed (the others no longer ran here: canceled or taken
/// over). Waits out a database outage; after one, a row already completed by this worker with
/// that token counts as recorded.
pub async fn complete_many_surely(
    db: &PgPool,
    worker_id: i64,
    done: &[(i64, &Outcome, Option<&str>)],
) -> Result<Vec<Changed>, sqlx::Error> {
    // (what `complete_runs` does, checked against the state machine)
    Transition::to(ExecutionStatus::Completed).from(&[ExecutionStatus::Running]).owned_by(worker_id).check();
    let outcomes = without_nuls(done);
    let columns = SuccessColumns::of(done, &outcomes);
    let first = columns.ids.first().copied().unwrap_or_default();
    let changed = surely(db, "recording successes", first, |mut connection, uncertain| {
        let columns = &columns;
        async move {
            // (after an outage, a success that landed is read back: completed here with its token)
            let rows = columns
                .bind(sqlx::query_as(
                    "SELECT id, status, action_ref, retry_count, worker \
                     FROM complete_runs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                ))
                .bind(worker_id)
                .bind(uncertain)
                .fetch_all(&mut *connection)
                .await;
            (connection, rows.map(Some))
        }
    })
    .await?;
    let changed = changed.unwrap_or_default();
    changed.iter().for_each(count_finished);
    Ok(changed)
}

/// A worker's claims and successes in one statement (`claim_many_surely` and
/// `complete_many_surely` together, each row with its own guard and fence): one round trip and one
/// commit where there would be two. Returns the runs it claimed and the rows it completed, as those
/// two do; waits out a database outage the same way.
pub async fn claim_and_complete_surely(
    db: &PgPool,
    worker_id: i64,
    claims: &[(i64, &str)],
    done: &[(i64, &Outcome, Option<&str>)],
) -> Result<(Vec<ClaimedRun>, Vec<Changed>), sqlx::Error> {
    Transition::claim(worker_id).check();
    Transition::to(ExecutionStatus::Completed).from(&[ExecutionStatus::Running]).owned_by(worker_id).check();
    let claim_ids: Vec<i64> = claims.iter().map(|(id, _)| *id).collect();
    let claim_tokens: Vec<&str> = claims.iter().map(|(_, token)| *token).collect();
    let outcomes = without_nuls(done);
    let columns = SuccessColumns::of(done, &outcomes);
    let first = claim_ids.first().or(columns.ids.first()).copied().unwrap_or_default();
    let rows = surely(db, "claiming and recording runs", first, |mut connection, uncertain| {
        let (claim_ids, claim_tokens, columns) = (&claim_ids, &claim_tokens, &columns);
        async move {
            // (both functions run, each once: the claims first; a claimed row is `running`, a
            // recorded one `completed`, and no run is both claimed and recorded in one batch)
            let query = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH recorded AS MATERIALIZED \
                   (SELECT * FROM complete_runs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)), \
                 claimed AS MATERIALIZED (SELECT * FROM claim_runs($11, $12, $9, $10)), \
                 c AS (SELECT * FROM claimed UNION ALL SELECT * FROM recorded) \
                 SELECT {RUN_COLUMNS}"
            )));
            let rows: Result<Vec<ClaimedRun>, _> = columns
                .bind(query)
                .bind(worker_id)
                .bind(uncertain)
                .bind(claim_ids)
                .bind(claim_tokens)
                .fetch_all(&mut *connection)
                .await;
            (connection, rows.map(Some))
        }
    })
    .await?
    .unwrap_or_default();
    // (a claim leaves its row running, a success completed)
    let (completed, claimed): (Vec<ClaimedRun>, Vec<ClaimedRun>) =
        rows.into_iter().partition(|row| row.status == ExecutionStatus::Completed);
    let completed: Vec<Changed> = completed
        .into_iter()
        .map(|row| Changed {
            id: row.id,
            status: row.status,
            action_ref: row.action_ref,
            retry_count: row.retry_count,
            worker: row.worker,
        })
        .collect();
    completed.iter().for_each(count_finished);
    Ok((claimed, completed))
}

/// The transition, or, if it finds nothing to change, the row when an earlier attempt of the same
/// transition evidently landed.
async fn transition_or_landed(
    db: &mut PgConnection,
    execution_id: i64,
    transition: &Transition<'_>,
) -> Result<Option<Changed>, sqlx::Error> {
    if let Some(changed) = transition_brief(&mut *db, execution_id, transition).await? {
        return Ok(Some(changed));
    }
    let row: Option<Changed> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {} FROM execution WHERE id = $1",
        <Changed as TransitionRow>::COLUMNS
    )))
    .bind(execution_id)
    .fetch_optional(db)
    .await?;
    // (back to `requested`, a row names no worker: waiting again is what was asked)
    let worker =
        transition.owned_by.or(transition.assign_worker).filter(|_| transition.to != ExecutionStatus::Requested);
    let landed = row.filter(|row| row.status == transition.to && worker.is_none_or(|w| row.worker == Some(w)));
    if let Some(row) = &landed {
        tracing::info!(execution_id, status = %row.status, "an earlier attempt landed (its acknowledgement was lost)");
        count_finished(row);
    }
    Ok(landed)
}

/// running → completed for the worker that ran it, with its outcome: how a success is recorded,
/// by that worker itself (or by an executor, for a result a worker could not record).
pub async fn complete(
    db: impl PgExecutor<'_>,
    execution_id: i64,
    worker_id: i64,
    outcome: &Outcome,
) -> Result<Option<Changed>, sqlx::Error> {
    transition_brief(db, execution_id, &Transition::completion(worker_id, outcome)).await
}

/// A waiting request claimed for a worker: what its dispatch carries.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Claimed {
    pub id: i64,
    pub worker: i64,
    pub action: Option<i64>,
    pub action_ref: String,
    pub parameters: Value,
    pub timeout_seconds: Option<i32>,
    pub retry_count: i32,
    pub not_before: Option<DateTime<Utc>>,
    pub created: DateTime<Utc>,
    pub idempotency_key: String,
    /// See `Execution::trace_parent`.
    pub trace_parent: Option<String>,
}

/// The batch form of `transition` for the scheduler: requested → scheduled for the oldest
/// waiting executions of `runtime` (a retry by its `not_before`), the first to `plan[0]`, the
/// next to `plan[1]`, and so on: one statement for as many executions as the plan has slots.
/// `SKIP LOCKED` lets several executors claim at once without taking a row twice. Claims for one
/// worker take turns, and each places on a worker no more than the room it has when the claim
/// runs (its reported slots less what is in flight on it): fewer rows than the plan means fewer
/// were waiting, or another executor filled the room first.
pub async fn claim_waiting(db: &PgPool, runtime: &str, plan: &[i64]) -> Result<Vec<Claimed>, sqlx::Error> {
    // the states stay literals: a bound one would keep a generic plan off the partial index
    // `execution_waiting_idx` (WHERE status = 'requested'). The rows picked are updated by the
    // tuple ids read under their row locks (which no other statement can move before this one
    // ends): joined by id, the planner, with statistics taken when few rows waited, would scan
    // every waiting row (and dead index entries) on each claim under a backlog.
    Transition::to(ExecutionStatus::Scheduled).from(&[ExecutionStatus::Requested]).check();
    // (`execution_claim`, migration `claim_within_room`: the claims for one worker take turns,
    // and each takes no more than the room the worker has when it runs)
    // (its commit waits for the WAL flush: a dispatch is published only for a claim, and for an
    // execution, that a crash cannot take back, which a workflow step made by an advance
    // committed without waiting, `db::workflow::begin_advance`, relies on)
    sqlx::query_as(
        "SELECT id, worker, action, action_ref, parameters, timeout_seconds, retry_count, not_before, created, \
            idempotency_key, trace_parent FROM execution_claim($1, $2)",
    )
    .bind(runtime)
    .bind(plan)
    .fetch_all(db)
    .await
}

/// `claim_waiting`, sure of its answer: if the claim fails on a lost connection (perhaps after
/// the server committed it, its acknowledgement lost), the executions of `runtime` claimed for the
/// plan's workers since `since` (the database's clock before the claim) are read back once the
/// database answers, and dispatched: a claim that landed is not left `scheduled` with no
/// dispatch. A row another executor claimed for the same worker at the same moment may be among
/// them; its second dispatch is a duplicate, which the worker drops.
pub async fn claim_waiting_surely(
    db: &PgPool,
    runtime: &str,
    plan: &[i64],
    since: DateTime<Utc>,
) -> Result<Vec<Claimed>, sqlx::Error> {
    match claim_waiting(db, runtime, plan).await {
        // (a lock timeout, say, committed nothing: nothing to read back)
        Err(e) if crate::db::is_connection_lost(&e) => {
            tracing::warn!(runtime, error = %e, "a claim's answer was lost; reading back what it claimed");
            crate::db::retry_while_unavailable("reading back a claim", || claimed_since(db, runtime, plan, since)).await
        }
        other => other,
    }
}

async fn claimed_since(
    db: &PgPool,
    runtime: &str,
    plan: &[i64],
    since: DateTime<Utc>,
) -> Result<Vec<Claimed>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, worker, action, action_ref, parameters, timeout_seconds, retry_count, not_before, created, \
            idempotency_key, trace_parent \
         FROM execution WHERE status = 'scheduled' AND runtime = $1 AND worker = ANY($2) AND updated >= $3 \
         ORDER BY id",
    )
    .bind(runtime)
    .bind(plan)
    .bind(since)
    .fetch_all(db)
    .await
}

/// The runtimes that have waiting (`requested`) executions: one index probe per runtime (a
/// loose index scan), whatever the number of waiting rows.
pub async fn waiting_runtimes(db: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH RECURSIVE r(runtime) AS ( \
            SELECT min(runtime) FROM execution WHERE status = 'requested' \
            UNION ALL \
            SELECT (SELECT min(runtime) FROM execution WHERE status = 'requested' AND runtime > r.runtime) \
            FROM r WHERE r.runtime IS NOT NULL) \
         SELECT runtime FROM r WHERE runtime IS NOT NULL",
    )
    .fetch_all(db)
    .await
}

/// Executions of `runtime` that have waited (`requested`) longer than `secs`, oldest first; paused
/// ones (`db::pause`) are left out: they wait on purpose.
pub async fn waiting_longer_than(
    db: &PgPool,
    runtime: &str,
    secs: f64,
    limit: i64,
) -> Result<Vec<Execution>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM execution e WHERE status = 'requested' AND runtime = $1 \
         AND COALESCE(not_before, created) < now() - make_interval(secs => $2) \
         AND NOT EXISTS (SELECT 1 FROM pause p WHERE (p.kind = 'runtime' AND p.name = $1) \
                         OR (p.kind = 'action' AND p.name = e.action_ref)) \
         ORDER BY COALESCE(not_before, created), id LIMIT $3"
    )))
    .bind(runtime)
    .bind(secs)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Waiting executions of `runtime` whose parameters need the secrets key, waiting longer than
/// `secs`, while no worker with the key (active or draining, its heartbeat younger than
/// `max_age_secs`) offers the runtime: only keyless workers could take them, and those are given
/// none (`execution_claim`). Paused ones are left out. Oldest first.
pub async fn waiting_for_key_longer_than(
    db: &PgPool,
    runtime: &str,
    secs: f64,
    max_age_secs: f64,
    limit: i64,
) -> Result<Vec<Execution>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM execution e WHERE status = 'requested' AND runtime = $1 \
         AND COALESCE(not_before, created) < now() - make_interval(secs => $2) \
         AND parameters_need_key(e.parameters) \
         AND NOT EXISTS (SELECT 1 FROM worker w WHERE w.status IN ('active', 'draining') \
                         AND w.last_heartbeat > now() - make_interval(secs => $3) \
                         AND w.capabilities->'runtimes' ? $1 AND worker_opens_secrets(w.capabilities)) \
         AND NOT EXISTS (SELECT 1 FROM pause p WHERE (p.kind = 'runtime' AND p.name = $1) \
                         OR (p.kind = 'action' AND p.name = e.action_ref)) \
         ORDER BY COALESCE(not_before, created), id LIMIT $4"
    )))
    .bind(runtime)
    .bind(secs)
    .bind(max_age_secs)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The oldest waiting executions of `runtime` whose action has no concurrency policy in force,
/// not paused (for the scheduler's claim one at a time, which is past the claim's count of what
/// runs: an action with a policy waits for the next batch claim).
pub async fn waiting_unlimited(db: &PgPool, runtime: &str, limit: i64) -> Result<Vec<Execution>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM execution e WHERE status = 'requested' AND runtime = $1 \
         AND NOT EXISTS (SELECT 1 FROM pause p WHERE (p.kind = 'runtime' AND p.name = $1) \
                         OR (p.kind = 'action' AND p.name = e.action_ref)) \
         AND NOT EXISTS (SELECT 1 FROM action a WHERE a.ref = e.action_ref \
                         AND concurrency_in_force(a.concurrency, a.concurrency_set) IS NOT NULL) \
         ORDER BY COALESCE(not_before, created), id LIMIT $2"
    )))
    .bind(runtime)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Waiting executions whose action was gone when they were submitted: nothing can run them.
pub async fn waiting_without_runtime(db: &PgPool, limit: i64) -> Result<Vec<Execution>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM execution WHERE status = 'requested' AND runtime IS NULL ORDER BY id LIMIT $1"
    )))
    .bind(limit)
    .fetch_all(db)
    .await
}

/// scheduled → requested, fenced by the worker it was assigned to: work that never started goes
/// back to waiting without spending a retry (a dispatch that could not be sent, a stopping
/// worker's hand-back, a dispatch lost with its queue). `None`: it had moved on.
pub async fn hand_back(
    db: impl PgExecutor<'_>,
    execution_id: i64,
    worker_id: i64,
) -> Result<Option<Changed>, sqlx::Error> {
    transition_brief(db, execution_id, &Transition::hand_back(worker_id)).await
}

/// The worker `worker_id` says the processes of the run `execution_id` (`None`: of all its runs)
/// are gone: a run ended by hand (`lingering`) frees its concurrency slot. How many did.
pub async fn release(db: &PgPool, execution_id: Option<i64>, worker_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT execution_released($1, $2)").bind(execution_id).bind(worker_id).fetch_one(db).await
}

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

/// `hand_back` as a worker makes it, through `execution_hand_back` (which runs as the schema's
/// owner and checks that the worker is one the caller's login registered: under row-level
/// security a worker's login may not write the handed-back row, on no worker, itself).
pub async fn hand_back_own(
    db: impl PgExecutor<'_>,
    execution_id: i64,
    worker_id: i64,
) -> Result<Option<Changed>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {} FROM execution_hand_back($1, $2)",
        <Changed as TransitionRow>::COLUMNS
    )))
    .bind(execution_id)
    .bind(worker_id)
    .fetch_optional(db)
    .await
}

/// `hand_back_own`, waiting out a database outage. After an attempt that may have landed
/// unacknowledged, finding nothing to hand back is the answer (`None`): the row is either
/// handed back already or has moved on, and either way is no longer this worker's.
pub async fn hand_back_own_surely(
    db: &PgPool,
    execution_id: i64,
    worker_id: i64,
) -> Result<Option<Changed>, sqlx::Error> {
    surely(db, "handing back a dispatch", execution_id, |mut connection, _| async move {
        let answer = hand_back_own(&mut *connection, execution_id, worker_id).await;
        (connection, answer)
    })
    .await
}

/// Whether the execution is still dispatched to this worker and not started (a dispatch that is
/// not is stale: canceled, handed back or taken elsewhere).
pub async fn still_dispatched(db: &PgPool, execution_id: i64, worker_id: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM execution WHERE id = $1 AND worker = $2 AND status = 'scheduled')")
        .bind(execution_id)
        .bind(worker_id)
        .fetch_one(db)
        .await
}

/// Of `ids` (executions running on this worker as far as it knows), those the database no
/// longer has running on it: canceled, failed by hand, or taken over. One indexed read by id.
pub async fn no_longer_running_on(db: &PgPool, worker_id: i64, ids: &[i64]) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM execution WHERE id = ANY($1) AND (status <> 'running' OR worker IS DISTINCT FROM $2)",
    )
    .bind(ids)
    .bind(worker_id)
    .fetch_all(db)
    .await
}

/// The executions dispatched to a worker and not started.
pub async fn scheduled_on(db: &PgPool, worker_id: i64) -> Result<Vec<i64>, sqlx::Error> {
    on_worker(db, worker_id, ExecutionStatus::Scheduled).await
}

/// The executions a worker is running, each with the run token its claim stored.
pub async fn runs_on(db: &PgPool, worker_id: i64) -> Result<Vec<(i64, Option<String>)>, sqlx::Error> {
    sqlx::query_as("SELECT id, run_token FROM execution WHERE worker = $1 AND status = $2 ORDER BY id")
        .bind(worker_id)
        .bind(ExecutionStatus::Running)
        .persistent(false)
        .fetch_all(db)
        .await
}

/// Whether the execution is still dispatched to or running on this worker: a cancel notice for
/// one that is did not come from a cancellation (the API changes the row before it sends one).
pub async fn still_on(db: &PgPool, execution_id: i64, worker_id: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM execution WHERE id = $1 AND worker = $2 AND status = ANY($3))")
        .bind(execution_id)
        .bind(worker_id)
        .bind(&ExecutionStatus::IN_FLIGHT[..])
        .fetch_one(db)
        .await
}

async fn on_worker(db: &PgPool, worker_id: i64, status: ExecutionStatus) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM execution WHERE worker = $1 AND status = $2 ORDER BY id")
        .bind(worker_id)
        .bind(status)
        .persistent(false)
        .fetch_all(db)
        .await
}

/// A worker's dispatches that it holds, delivered and not yet started, marked as still held
/// (`updated` set to now; no status changes), so that the monitor does not take them for lost.
pub async fn keep_held(db: &PgPool, worker_id: i64, execution_ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution SET updated = now() WHERE id = ANY($2) AND worker = $1 AND status = 'scheduled'")
        .bind(worker_id)
        .bind(execution_ids)
        .execute(db)
        .await?;
    Ok(())
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

/// The retry of `execution_id`, if one exists.
pub async fn retry_of(db: impl PgExecutor<'_>, execution_id: i64) -> Result<Option<Execution>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM execution WHERE original_execution = $1")))
        .bind(execution_id)
        .fetch_optional(db)
        .await
}

/// `SELECT {select} FROM execution WHERE <the attempts of the retry chain $1 belongs to>`: the
/// chain is walked up to its first attempt and down again through `original_execution` (ids
/// only, at most 10000 steps each way), and its rows read once.
fn chain_walk(select: &str) -> String {
    format!(
        "WITH RECURSIVE up AS ( \
            SELECT id, original_execution, 0 AS depth FROM execution WHERE id = $1 \
            UNION ALL \
            SELECT e.id, e.original_execution, up.depth + 1 FROM execution e JOIN up ON e.id = up.original_execution \
            WHERE up.depth < 10000), \
         root AS (SELECT id FROM up ORDER BY depth DESC LIMIT 1), \
         down AS ( \
            SELECT e.id, 0 AS depth FROM execution e JOIN root ON e.id = root.id \
            UNION ALL \
            SELECT e.id, down.depth + 1 FROM execution e JOIN down ON e.original_execution = down.id \
            WHERE down.depth < 10000) \
         SELECT {select} FROM execution WHERE id IN (SELECT id FROM down)"
    )
}

/// Every attempt in the retry chain `execution_id` belongs to, first attempt first.
pub async fn chain(db: &PgPool, execution_id: i64) -> Result<Vec<Execution>, sqlx::Error> {
    let sql = format!("{} ORDER BY retry_count, id", chain_walk(COLUMNS));
    sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(execution_id).fetch_all(db).await
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
