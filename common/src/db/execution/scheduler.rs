//! An executor's scheduler: the runtimes with waiting requests, the claim of a plan of worker
//! slots (`execution_claim`, sure of its answer), and the requests that waited too long for a
//! worker, or for one that holds the secrets key.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

use attune_core::status::ExecutionStatus;

use super::{COLUMNS, Execution, Patience, Transition, patiently};

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

/// What a claim returns of each row (`Claimed`), the claim's own and its read-back's alike: a
/// literal, so that both statements stay static text.
macro_rules! claimed_columns {
    () => {
        "id, worker, action, action_ref, parameters, timeout_seconds, retry_count, not_before, created, \
         idempotency_key, trace_parent"
    };
}

/// The batch form of `transition` for the scheduler: requested → scheduled for the oldest
/// waiting executions of `runtime` (a retry by its `not_before`), the first to `plan[0]`, the
/// next to `plan[1]`, and so on: one statement for as many executions as the plan has slots.
/// `SKIP LOCKED` lets several executors claim at once without taking a row twice. Claims for one
/// worker take turns, and each places on a worker no more than the room it has when the claim
/// runs (its reported slots less what is in flight on it): fewer rows than the plan means fewer
/// were waiting, or another executor filled the room first.
///
/// With `Patience::Surely`, a claim in doubt (an attempt cut off by an outage, perhaps after the
/// server committed it) is not made again: the executions of `runtime` claimed for the plan's
/// workers since `since` (the database's clock before the claim) are read back once the database
/// answers, and dispatched, so that a claim that landed is not left `scheduled` with no dispatch.
/// A row another executor claimed for the same worker at the same moment may be among them; its
/// second dispatch is a duplicate, which the worker drops.
pub async fn claim_waiting(
    db: &PgPool,
    runtime: &str,
    plan: &[i64],
    since: DateTime<Utc>,
    patience: Patience,
) -> Result<Vec<Claimed>, sqlx::Error> {
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
    let first = plan.first().copied().unwrap_or_default();
    patiently(db, "claiming waiting executions", first, patience, |mut connection, doubt| async move {
        let answer = match doubt {
            true => {
                tracing::warn!(runtime, "a claim's answer was lost; reading back what it claimed");
                claimed_since(&mut connection, runtime, plan, since).await
            }
            false => {
                sqlx::query_as(concat!("SELECT ", claimed_columns!(), " FROM execution_claim($1, $2)"))
                    .bind(runtime)
                    .bind(plan)
                    .fetch_all(&mut *connection)
                    .await
            }
        };
        (connection, answer)
    })
    .await
}

async fn claimed_since(
    db: &mut sqlx::PgConnection,
    runtime: &str,
    plan: &[i64],
    since: DateTime<Utc>,
) -> Result<Vec<Claimed>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        claimed_columns!(),
        " FROM execution WHERE status = 'scheduled' AND runtime = $1 AND worker = ANY($2) AND updated >= $3 \
         ORDER BY id"
    ))
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
