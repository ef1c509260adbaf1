//! The execution table, by caller. This file holds what every caller shares: the row
//! (`Execution`), the new row (`NewExecution`), the one insert and read of a row, and the guarded
//! writes of `status` (`Transition`, `transition`), with `Patience`, the one policy by which a
//! write waits out a database outage and answers after a doubt (an acknowledgement lost with the
//! connection). What only one caller does is in that caller's file:
//!
//! | file | caller | what |
//! |---|---|---|
//! | `api.rs` | the API | submissions (batched, keyed, sure of their answer), lists, chains, attempts, bulk selections |
//! | `scheduler.rs` | an executor's scheduler | waiting requests, the claim of a plan, what waits too long |
//! | `worker.rs` | a worker | its claims and successes (batched), hand-backs, what it holds and runs |
//! | `monitor.rs` | an executor's monitor, completion and retry timer | lost dispatches, silent workers, overdue runs, due retries, released slots |
//!
//! Every write of `execution.status` is in this folder (docs/adr/0003).

pub mod api;
pub mod monitor;
pub mod scheduler;
pub mod worker;

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
    /// The schedule (`schedule.id`) whose run this first attempt is, and the occurrence
    /// (`of_schedule`); a retry keeps its parent's.
    pub occurrence: Option<(i64, DateTime<Utc>)>,
}

impl NewExecution {
    /// The first attempt of `action`, with `parameters` as the caller checked and resolved them
    /// against its declarations and the submitter's `config` (the retry fields the record keeps
    /// in it are set at the insert, `recorded_config`): the one way a first attempt is made, by
    /// the API's submissions, a rule's event and a schedule's run now. A schedule's occurrence is
    /// made by a function of the database that the executors' login may call but whose row it
    /// may not write (`schedule_fire`): it restates this in SQL, held to it by
    /// `common/tests/repository.rs` (`a_schedules_occurrence_is_the_first_attempt_the_api_makes`).
    /// (A workflow's step is no plain first attempt: `workflow_step_start` gives it the step's own
    /// retry budget and its place in the run.)
    pub fn first_attempt(
        action: &crate::db::action::Action,
        parameters: Value,
        config: Value,
        default_timeout_secs: i32,
    ) -> NewExecution {
        NewExecution {
            action: Some(action.id),
            action_ref: action.action_ref.clone(),
            runtime: Some(action.runtime.clone()),
            parameters,
            config,
            status: ExecutionStatus::Requested,
            max_retries: action.max_retries.unwrap_or(0),
            timeout_seconds: action.timeout_seconds.unwrap_or(default_timeout_secs),
            retry_count: 0,
            retry_reason: None,
            original_execution: None,
            not_before: None,
            idempotency_key: None,
            trace_parent: None,
            occurrence: None,
        }
    }

    /// This first attempt is occurrence `at` of schedule `schedule` (named `name`): recorded as
    /// the schedule's, in its columns and in `config` (`schedule`, `scheduled_for`: the same
    /// instant as RFC 3339, to the microsecond the column keeps).
    pub fn of_schedule(mut self, schedule: i64, name: &str, at: DateTime<Utc>) -> NewExecution {
        if !self.config.is_object() {
            self.config = Value::Object(Default::default());
        }
        let at = chrono::SubsecRound::trunc_subsecs(at, 6);
        self.config["schedule"] = name.into();
        self.config["scheduled_for"] = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, false).into();
        self.occurrence = Some((schedule, at));
        self
    }
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
            occurrence: None,
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

/// Inserts `new` on no token's behalf (an automatic retry keeps its parent's `submitted_by`).
pub async fn insert(db: impl PgExecutor<'_>, new: &NewExecution) -> Result<Execution, sqlx::Error> {
    insert_submitted(db, new, None).await
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
         COALESCE($14, parent.submitted_by), $15, COALESCE($16, parent.schedule), COALESCE($17, parent.scheduled_for), \
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
        .bind(new.occurrence.map(|(schedule, _)| schedule))
        .bind(new.occurrence.map(|(_, at)| at))
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

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Execution>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM execution WHERE id = $1")))
        .bind(id)
        .fetch_optional(db)
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

/// How a write of executions meets a database outage: the repository's one policy for writes
/// that must be neither lost nor made twice (`patiently` runs each attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// One attempt, whose error is the answer: the caller has another way on (a redelivery, the
    /// monitor's next look, one try by design).
    Once,
    /// Attempts until one answers other than with a passing outage, backing off from 100 ms to
    /// 5 s. An attempt after one whose connection was lost (or went unanswered) is told that it
    /// is in doubt (that one may have landed, its acknowledgement lost), and reads back what
    /// landed rather than writing it again; after an outage that wrote nothing (a pool timeout, a
    /// lock timeout, too many connections) it is made again as it is.
    Surely,
}

/// `transition_brief` on a connection of `db`, meeting an outage as `patience` says. In doubt,
/// when it finds nothing to change the row is read, and if it is already where this transition
/// takes it (its target state, on the worker it fences by or assigns), the earlier attempt
/// landed and its row is the answer, not a stale message.
pub async fn transition_with(
    db: &PgPool,
    what: &str,
    execution_id: i64,
    transition: &Transition<'_>,
    patience: Patience,
) -> Result<Option<Changed>, sqlx::Error> {
    patiently(db, what, execution_id, patience, |mut connection, doubt| async move {
        let answer = match doubt {
            true => transition_or_landed(&mut connection, execution_id, transition).await,
            false => transition_brief(&mut *connection, execution_id, transition).await,
        };
        (connection, answer)
    })
    .await
}

/// Runs `attempt` on a connection of `db` lent to it for at most `db::answer_deadline` (half-open:
/// the statement timeout plus 5 s; an attempt not answered by then abandons its connection,
/// `db::answered_within`, and counts as lost). With `Patience::Surely` it runs again, on another
/// connection, while the answer is a passing outage; as `attempt(connection, true)`, in doubt,
/// once an attempt's connection was lost (`db::is_connection_lost`: the write may have landed).
/// `key` names what is written in the log (an execution's or a worker's id).
async fn patiently<T, Fut>(
    db: &PgPool,
    what: &str,
    key: i64,
    patience: Patience,
    mut attempt: impl FnMut(Lent, bool) -> Fut,
) -> Result<T, sqlx::Error>
where
    Fut: std::future::Future<Output = (Lent, Result<T, sqlx::Error>)>,
{
    let deadline = crate::db::answer_deadline(db);
    let mut doubt = false;
    let mut delay = std::time::Duration::from_millis(100);
    loop {
        let answer = crate::db::answered_within(db, deadline, |connection| attempt(connection, doubt)).await;
        match answer {
            Err(e) if patience == Patience::Surely && crate::db::is_transient(&e) => {
                // (an outage that wrote nothing leaves nothing to read back: another
                // executor's claims would be read as this one's)
                doubt = doubt || crate::db::is_connection_lost(&e);
                tracing::warn!(key, error = %e, retry_in_ms = delay.as_millis() as u64, "{what}: dependency unavailable, waiting");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
            other => return other,
        }
    }
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
