//! Executions: submit (with an optional `Idempotency-Key`, see `idempotency`), read, list, retry,
//! cancel, fail; a retry chain in `chain`; live output in `output`.

use attune_common::db::{self, execution::Execution, execution::NewExecution, execution::api::ListFilter};
use attune_core::{ExecutionStatus, FailureKind, params, recovery};
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sqlx::PgExecutor;

use crate::ApiError;
use crate::audit::Target;
use crate::server::Withdrawal;

pub mod bulk;
pub mod chain;
mod idempotency;
pub mod output;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExecution {
    /// The action, as `pack.name`.
    #[schema(pattern = r"^[^\x00]*$")]
    pub action_ref: String,
    /// Checked against the action's declared parameters; defaults are filled in.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// Free-form, at most `ATTUNE_API_MAX_CONFIG_BYTES` (16384) as JSON, else 413 naming `config`
    /// (every retry carries a copy); `retry_of` (with `max_retries`) makes this a manual retry
    /// (quick reference Example 4).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Option<Value>,
}

fn object(parameter: &str, value: Option<Value>) -> Result<Map<String, Value>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(ApiError::invalid(parameter, format!("'{parameter}' must be a JSON object"))),
    }
}

#[utoipa::path(post, path = "/executions", operation_id = "create_execution", tag = "executions", request_body = CreateExecution,
    params(("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 255, pattern = r"^[\x21-\x7E]+$",
        description = "Makes the submission safe to repeat: for 24 hours, the same key (per API token) with the same body answers 200 with the execution the first request created, and creates nothing; with a different body, 409")),
    responses(
        (status = 200, description = "A repeat of an earlier submission with the same `Idempotency-Key` and body: the execution it created (nothing new is created)", body = Execution),
        (status = 201, description = "The new execution (a manual retry with `config.retry_of`)", body = Execution),
        (status = 400, description = "A malformed `Idempotency-Key` header (empty, over 255 bytes, not visible ASCII, or sent twice; `parameter` names it), or a body that is not JSON", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such action (or execution to retry)", body = crate::openapi::ErrorBody),
        (status = 409, description = "Already retried, or not finished; or (`idempotency_key_reused`) the `Idempotency-Key` was used with a different body within 24 hours, `execution_id` naming the execution it created", body = crate::openapi::ErrorBody),
        (status = 413, description = "The parameters are too large (ATTUNE_API_MAX_PARAMETERS_BYTES, ATTUNE_API_MAX_PARAMETER_VALUE_BYTES), or the `config` (ATTUNE_API_MAX_CONFIG_BYTES, 16384 bytes as JSON by default); `parameter` names the one, or `config`", body = crate::openapi::ErrorBody),
        (status = 422, description = "A parameter is invalid; `parameter` names it", body = crate::openapi::ErrorBody),
    ))]
pub async fn create(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    withdrawal: Option<Extension<Withdrawal>>,
    headers: HeaderMap,
    crate::error::JsonObject(body): crate::error::JsonObject<CreateExecution>,
) -> Result<(StatusCode, Extension<Target>, Json<Execution>), ApiError> {
    let withdrawal = withdrawal.map(|Extension(withdrawal)| withdrawal).unwrap_or_default();
    let mut span = request_span("POST /executions", &headers);
    let mut audited_with_it = false;
    let created = async {
        let Some(key) = idempotency::key(&headers)? else {
            let new = traced(plan(&state, body).await?, &mut span);
            if new.original_execution.is_some() {
                // a manual retry (`config.retry_of`): on its own, for the one-retry-per-parent check
                let execution = insert_audited(&state, &withdrawal, &asking, &new, caller.token_id).await?;
                audited_with_it = true;
                count_manual_retry(&execution);
                return Ok((StatusCode::CREATED, Json(execution)));
            }
            // a first attempt: written with the others that come meanwhile (unless its request
            // times out while it waits for them), with its audit row in the same statement
            let by = db::execution::Submitter { token: caller.token_id, audited: asking.asked() };
            let execution = state.submissions.submit(new, by, withdrawal).await?;
            audited_with_it = true;
            return Ok((StatusCode::CREATED, Json(execution)));
        };
        let keyed = idempotency::Keyed::new(caller.token_id, key, &body);
        let created = keyed.submit(&state, &withdrawal, &asking, body, &mut span).await?;
        // (a new execution was written with its row; a repeat, which changed nothing, was not)
        audited_with_it = created.0 == StatusCode::CREATED;
        Ok(created)
    }
    .await;
    if let Ok((_, Json(execution))) = &created {
        span.attribute("attune.execution_id", execution.id);
    }
    created.map(|created| {
        let (status, Extension(target), json) = audited(created);
        (status, Extension(Target { written: audited_with_it, ..target }), json)
    })
}

/// An answer with the execution it made or gave back named for its audit row.
fn audited(
    (status, Json(execution)): (StatusCode, Json<Execution>),
) -> (StatusCode, Extension<Target>, Json<Execution>) {
    (status, Extension(Target::new(format!("execution:{}", execution.id))), Json(execution))
}

/// The span of a request that submits an execution: the child of the client's W3C `traceparent`
/// header if it sent a valid one (none when traces are off).
fn request_span(name: &'static str, headers: &HeaderMap) -> attune_common::trace::Span {
    let client = headers.get("traceparent").and_then(|value| value.to_str().ok());
    attune_common::trace::span(name, attune_common::trace::Kind::Server, None, client)
}

/// `new` with the trace its spans hang under: a retry's chain's (the first submission's), linked
/// from the request's span; otherwise the request's span itself.
fn traced(mut new: NewExecution, span: &mut attune_common::trace::Span) -> NewExecution {
    match new.trace_parent.as_deref() {
        Some(chain) => span.link(chain),
        None => new.trace_parent = span.traceparent(),
    }
    new
}

/// Checks a submission and returns what to insert: a first attempt of the action, or (the seed's
/// Example 4, `config.retry_of`) a manual retry.
pub(crate) async fn plan(state: &crate::AppState, body: CreateExecution) -> Result<NewExecution, ApiError> {
    crate::error::storable("action_ref", &body.action_ref)?;
    for (field, value) in [("parameters", &body.parameters), ("config", &body.config)] {
        if let Some(value) = value {
            crate::error::storable_json(field, value)?;
        }
    }
    if let Some(config) = &body.config {
        config_within_limit(state, config)?;
    }
    let parameters_given = body.parameters.as_ref().is_some_and(|p| !p.is_null());
    let given = object("parameters", body.parameters)?;
    let config = object("config", body.config)?;
    if let Some(retry_of) = config.get("retry_of") {
        // A retry submitted as a new execution (`config.retry_of`; the specification's Example 4).
        let parent = retry_of
            .as_i64()
            .ok_or_else(|| ApiError::invalid("config.retry_of", "'config.retry_of' must be an execution id"))?;
        // without `parameters` the retry keeps the retried execution's own
        let parameters = parameters_given.then_some(given);
        let request = ManualRetry {
            parent,
            action_ref: Some(body.action_ref),
            parameters,
            merge: false,
            config,
            step_as_run: false,
        };
        return plan_manual_retry(state, request).await;
    }
    let action = state
        .actions
        .get_by_ref(&state.db, &body.action_ref)
        .await?
        .ok_or_else(|| ApiError::not_found("action", format!("action '{}' does not exist", body.action_ref)))?;
    let specs: params::ParamSpecs = serde_json::from_value(action.parameters.clone())
        .map_err(|e| ApiError::internal("stored parameter declarations are unreadable", e))?;
    let resolved = params::validate(&specs, &given)
        .map_err(|e| ApiError::invalid(&format!("parameters.{}", e.parameter), e.to_string()))?;
    within_limits(state, &resolved)?;
    secrets_for(state, &action.action_ref, &resolved).await?;
    let resolved = sealed(state, &action.action_ref, &specs, resolved)?;
    let default_timeout = state.settings.common.default_timeout_secs;
    Ok(NewExecution::first_attempt(&action, Value::Object(resolved), Value::Object(config), default_timeout))
}

/// Inserts a planned execution, submitted by the token `submitted_by`. A manual retry that another
/// retry of the same execution beat (the unique index on `original_execution`) is a 409 naming
/// that retry.
async fn insert(
    state: &crate::AppState,
    db: impl PgExecutor<'_>,
    new: &NewExecution,
    submitted_by: i64,
) -> Result<Execution, ApiError> {
    match db::execution::insert_submitted(db, new, Some(submitted_by)).await {
        Ok(execution) => Ok(execution),
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("execution_one_retry_per_parent") => {
            let parent = new.original_execution.unwrap_or_default();
            let existing = db::execution::retry_of(&state.db, parent).await?.map(|e| e.id).unwrap_or_default();
            Err(already_retried(parent, existing))
        }
        Err(e) => Err(e.into()),
    }
}

/// `insert` in a transaction of its own with the request's audit row (answered `201`, naming the
/// execution), committed unless the request timed out meanwhile: once the commit is sent the
/// request timeout can no longer answer that nothing was written, so the request waits for it
/// (see `server::Withdrawal`).
async fn insert_audited(
    state: &crate::AppState,
    withdrawal: &Withdrawal,
    asking: &crate::audit::Asking,
    new: &NewExecution,
    submitted_by: i64,
) -> Result<Execution, ApiError> {
    let mut transaction = state.db.begin().await?;
    let execution = insert(state, &mut *transaction, new, submitted_by).await?;
    if !withdrawal.begin_write() {
        return Err(ApiError::request_timeout(state.settings.http.request_timeout));
    }
    let target = Target::new(format!("execution:{}", execution.id));
    // (the answer names the execution again: `audited`, marked written by the caller)
    let _written = asking.commit(transaction, StatusCode::CREATED, target).await?;
    Ok(execution)
}

/// After an execution is committed: a manual retry is logged and counted (only ever for a new
/// execution, never for a repeat answered from its key). Its request needs no message: the
/// database announces it to the executors at its commit (`db::announcements`).
fn count_manual_retry(execution: &Execution) {
    if let Some(retried) = execution.original_execution {
        tracing::info!(execution_id = execution.id, retried, "manual retry requested");
        attune_common::metrics::increment(&attune_common::metrics::RETRIES_CREATED, &[("reason", "manual_retry")], 1);
    }
}

/// Refuses a reference to a stored secret that is not for `action_ref` (its `users`), naming the
/// parameter: the workers are held to the same rule (`run_secrets` opens no such secret).
async fn secrets_for(state: &crate::AppState, action_ref: &str, resolved: &Map<String, Value>) -> Result<(), ApiError> {
    let references: Vec<(&String, &str)> =
        resolved.iter().filter_map(|(name, value)| params::secret_reference(value).map(|s| (name, s))).collect();
    if references.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = references.iter().map(|(_, secret)| secret.to_string()).collect();
    let refused = db::secret::not_for(&state.db, action_ref, &names).await?;
    match references.iter().find_map(|(name, secret)| refused.iter().find(|(s, _)| s == secret).map(|r| (name, r))) {
        Some((name, (secret, users))) => Err(ApiError::invalid(
            &format!("parameters.{name}"),
            format!(
                "parameter '{name}': the secret '{secret}' is not for {action_ref} (it is for: {}); an admin adds users with `attune secret set {secret} --users ...`",
                users.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// `parameters` with the value of each parameter declared `secret: true` sealed with the API's
/// key (a reference to a stored secret stays as it is); without a key such a value is refused,
/// naming the parameter.
fn sealed(
    state: &crate::AppState,
    action_ref: &str,
    specs: &params::ParamSpecs,
    mut parameters: Map<String, Value>,
) -> Result<Map<String, Value>, ApiError> {
    for (name, _) in specs.iter().filter(|(_, spec)| spec.secret) {
        let Some(Value::String(plain)) = parameters.get(name) else { continue };
        let sealer = state.settings.sealer.as_ref().ok_or_else(|| {
            ApiError::invalid(
                &format!("parameters.{name}"),
                format!(
                    "parameter '{name}' is secret, and this API has no {} to seal it: pass a reference to a stored secret ({{\"$secret\": \"<name>\"}}) or set the key",
                    attune_common::secrets::KEY_FILE
                ),
            )
        })?;
        let sealed = sealer.seal_parameter(action_ref, name, plain);
        parameters.insert(name.clone(), sealed);
    }
    Ok(parameters)
}

/// Refuses parameters larger than the API's limits (413, naming the parameter, or the largest one
/// when only the total is over): an action could not be started with them.
fn within_limits(state: &crate::AppState, resolved: &Map<String, Value>) -> Result<(), ApiError> {
    params::check_size(resolved, state.settings.parameter_limits).map_err(|too| {
        let message = if too.total {
            format!(
                "the parameters take {} bytes as JSON, more than the limit of {} (ATTUNE_API_MAX_PARAMETERS_BYTES); the largest is '{}'",
                too.bytes, too.limit, too.parameter
            )
        } else {
            format!(
                "parameter '{}' takes {} bytes, more than the limit of {} per value (ATTUNE_API_MAX_PARAMETER_VALUE_BYTES)",
                too.parameter, too.bytes, too.limit
            )
        };
        let mut error = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message);
        error.parameter = Some(format!("parameters.{}", too.parameter));
        error
    })
}

/// Refuses a `config` larger than `ATTUNE_API_MAX_CONFIG_BYTES` as JSON (413, naming `config`):
/// every retry of the execution carries a copy of it, so one large `config` is held as many
/// times as the chain has attempts.
fn config_within_limit(state: &crate::AppState, config: &Value) -> Result<(), ApiError> {
    let (bytes, limit) = (json_bytes(config), state.settings.max_config_bytes);
    if bytes <= limit {
        return Ok(());
    }
    let message =
        format!("'config' takes {bytes} bytes as JSON, more than the limit of {limit} (ATTUNE_API_MAX_CONFIG_BYTES)");
    let mut error = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message);
    error.parameter = Some("config".to_string());
    Err(error)
}

/// The length of `value` written as compact JSON, counted without writing it out.
fn json_bytes(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value).expect("a JSON value serializes");
    counter.0
}

/// An execution with where its retry chain goes next, and the names of the tokens that submitted
/// and ended it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecutionView {
    #[serde(flatten)]
    pub execution: Execution,
    /// The name of the token `submitted_by` names.
    pub submitted_by_name: Option<String>,
    /// The name of the token `ended_by` names.
    pub ended_by_name: Option<String>,
    /// The execution that retries this one, if any.
    pub retried_by: Option<i64>,
    /// When the next attempt runs, while a retry is waiting out its backoff.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Why it waits, while it does (`requested`, `delayed`, `scheduling`): `reason` (`backoff`,
    /// `scheduling`, `paused`, `concurrency`, `no_worker`, `workers_full`, `queued`), what holds it
    /// (the pause and who made it, the concurrency key and the executions holding it, the
    /// runtime), and a `message` in words. Null once it runs.
    #[schema(value_type = Option<Object>)]
    pub waiting: Option<Value>,
}

/// The execution `id`, read on `db` (a change's transaction reads on its own connection: taking
/// a second from the pool while it holds one would let as many concurrent changes as the pool
/// has connections wait for each other).
async fn find_on(db: impl PgExecutor<'_>, id: i64) -> Result<Execution, ApiError> {
    db::execution::get(db, id)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", format!("execution {id} does not exist")))
}

#[utoipa::path(get, path = "/executions/{id}", operation_id = "get_execution", tag = "executions", params(("id" = i64, Path, description = "Execution id")),
    responses((status = 200, body = ExecutionView),
        (status = 404, description = "No such execution", body = crate::openapi::ErrorBody),))]
pub async fn get(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<ExecutionView>, ApiError> {
    let Path(id) = id?;
    // the execution and its retry from one snapshot: a failure is never shown without the retry
    // recorded with it, nor a running execution with a retry
    let mut snapshot = db::snapshot(&state.db).await?;
    let execution = db::execution::get(&mut *snapshot, id)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", format!("execution {id} does not exist")))?;
    let retry = db::execution::retry_of(&mut *snapshot, id).await?;
    let next_attempt_at = match (&retry, execution.status) {
        (_, ExecutionStatus::Delayed) => execution.not_before,
        (Some(retry), _) if retry.status == ExecutionStatus::Delayed => retry.not_before,
        _ => None,
    };
    let mut waiting = if execution.status.is_terminal() || execution.status == ExecutionStatus::Running {
        None
    } else {
        db::execution::api::waiting(&mut *snapshot, id).await?
    };
    let paused_by = waiting.as_ref().and_then(|w| w["paused_by"].as_i64());
    let tokens: Vec<i64> = [execution.submitted_by, execution.ended_by, paused_by].into_iter().flatten().collect();
    let names = if tokens.is_empty() { Vec::new() } else { db::token::names(&mut *snapshot, &tokens).await? };
    let name_of = |token: Option<i64>| names.iter().find(|(id, _)| Some(*id) == token).map(|(_, name)| name.clone());
    if let (Some(waiting), Some(name)) = (waiting.as_mut(), name_of(paused_by)) {
        waiting["paused_by_name"] = Value::String(name);
    }
    Ok(Json(ExecutionView {
        waiting,
        retried_by: retry.map(|r| r.id),
        next_attempt_at,
        submitted_by_name: name_of(execution.submitted_by),
        ended_by_name: name_of(execution.ended_by),
        execution,
    }))
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Replaces the parameters of the execution being retried (with `merge`, only those it names).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// `parameters` names only what changes: every other parameter keeps the retried execution's
    /// value (a sealed secret one as it was sealed).
    #[serde(default)]
    pub merge: bool,
}

#[utoipa::path(post, path = "/executions/{id}/retry", operation_id = "retry_execution", tag = "executions", params(("id" = i64, Path, description = "The finished execution to retry")),
    request_body(content = Option<RetryBody>, description = "Optional replacement parameters (no body, or `null`, keeps the retried execution's)"),
    responses((status = 201, description = "The retry", body = Execution),
        (status = 404, description = "No such execution", body = crate::openapi::ErrorBody),
        (status = 409, description = "Already retried (`retry_execution` names the retry), or not finished; or (`workflow_step`) a step of a workflow run that completed or still runs (a step of a run that ended without success is retried as its run, from the steps that did not complete)", body = crate::openapi::ErrorBody),
        (status = 413, description = "The replacement parameters are too large; `parameter` names the one", body = crate::openapi::ErrorBody),
        (status = 422, description = "A parameter is invalid", body = crate::openapi::ErrorBody),))]
pub async fn retry(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    withdrawal: Option<Extension<Withdrawal>>,
    id: Result<Path<i64>, PathRejection>,
    headers: HeaderMap,
    body: Result<Option<Json<Value>>, JsonRejection>,
) -> Result<(StatusCode, Extension<Target>, Json<Execution>), ApiError> {
    let withdrawal = withdrawal.map(|Extension(withdrawal)| withdrawal).unwrap_or_default();
    let Path(parent) = id?;
    // no body (no Content-Type) or JSON `null` keeps the retried execution's parameters; a body
    // that is not JSON is refused (415), never taken for "no body"
    let body: RetryBody = match body {
        Ok(None) | Ok(Some(Json(Value::Null))) => RetryBody::default(),
        Ok(Some(Json(value))) => crate::error::object_body(value)?,
        Err(rejection) => return Err(rejection.into()),
    };
    if let Some(parameters) = &body.parameters {
        crate::error::storable_json("parameters", parameters)?;
    }
    let parameters = match body.parameters {
        None => None,
        some => Some(object("parameters", some)?),
    };
    let request =
        ManualRetry { parent, action_ref: None, parameters, merge: body.merge, config: Map::new(), step_as_run: true };
    let mut span = request_span("POST /executions/{id}/retry", &headers);
    let new = traced(plan_manual_retry(&state, request).await?, &mut span);
    let execution = insert_audited(&state, &withdrawal, &asking, &new, caller.token_id).await?;
    count_manual_retry(&execution);
    span.attribute("attune.execution_id", execution.id);
    let (status, Extension(target), json) = audited((StatusCode::CREATED, Json(execution)));
    Ok((status, Extension(Target { written: true, ..target }), json))
}

/// The retried execution's parameters with `changes` over them, and apart, those it keeps sealed
/// (checked when they were sealed: they stand in the check as a reference does, and are put back
/// after it).
fn merged(previous: &Value, changes: Map<String, Value>) -> (Map<String, Value>, Map<String, Value>) {
    let mut given = Map::new();
    let mut kept_sealed = Map::new();
    for (name, value) in previous.as_object().into_iter().flatten() {
        if changes.contains_key(name) {
            continue;
        }
        if value.as_object().is_some_and(|o| o.contains_key(params::SEALED_KEY)) {
            kept_sealed.insert(name.clone(), value.clone());
            given.insert(name.clone(), serde_json::json!({ params::SECRET_KEY: "attune-kept-sealed" }));
        } else {
            given.insert(name.clone(), value.clone());
        }
    }
    given.extend(changes);
    (given, kept_sealed)
}

struct ManualRetry {
    parent: i64,
    /// When given (a retry submitted as a new execution names it), it must be the retried
    /// execution's action.
    action_ref: Option<String>,
    parameters: Option<Map<String, Value>>,
    /// `parameters` are changes to the retried execution's.
    merge: bool,
    /// Extra config from the client (a retry submitted as a new execution carries it); `max_retries`
    /// in it sets the budget.
    config: Map<String, Value>,
    /// A step of a workflow run that ended without success is retried as its run (the retry
    /// route's "retry from the failed step"); elsewhere (a bulk retry, a retry submitted as a new
    /// execution) a step is refused, naming its run.
    step_as_run: bool,
}

/// An operator's retry: allowed on any terminal execution that has not been retried yet, whatever
/// its failure kind or retry count; recorded as `manual_retry` and requested at once. Returns the
/// retry to insert.
async fn plan_manual_retry(state: &crate::AppState, request: ManualRetry) -> Result<NewExecution, ApiError> {
    let mut parent = db::execution::get(&state.db, request.parent).await?.ok_or_else(|| {
        let mut error = ApiError::not_found("execution", format!("execution {} does not exist", request.parent));
        error.parameter = Some(if request.action_ref.is_some() { "config.retry_of" } else { "id" }.to_string());
        error
    })?;
    if let (Some(run_id), Some(step)) = (parent.workflow_run, parent.workflow_step.clone()) {
        // Retry from the failed step: its run decides what runs next, so a step of a run that
        // ended without success is retried as its run, which runs again only the steps that did
        // not complete. A run that completed, or still runs, is left to itself.
        let step_id = parent.id;
        let refused = |why: String| {
            ApiError::new(
                StatusCode::CONFLICT,
                "workflow_step",
                format!("execution {step_id} is step '{step}' of workflow run {run_id}: {why}"),
            )
        };
        if !request.step_as_run {
            return Err(refused(format!(
                "retry the run (POST /api/v1/executions/{run_id}/retry), which runs again only the steps that did not \
                 complete"
            )));
        }
        parent = match db::execution::get(&state.db, run_id).await? {
            None => return Err(refused("the run no longer exists".to_string())),
            Some(run) if run.status == ExecutionStatus::Completed => {
                return Err(refused("the run completed: submit a new run to run its steps again".to_string()));
            }
            Some(run) if !run.status.is_terminal() => {
                return Err(refused(format!(
                    "the run is {}: its step's own retries and its on-failure path decide what runs next; retry \
                     it from here once the run has ended",
                    run.status
                )));
            }
            Some(run) => run,
        };
    }
    if parent.runtime.as_deref() == Some(attune_core::workflow::RUNTIME) && request.parameters.is_some() {
        // its completed steps stand in the retry: they ran with its input
        return Err(ApiError::invalid(
            "parameters",
            format!(
                "execution {} is a workflow run: a retry keeps its input, and what its steps completed stands; \
                 submit a new run for other input",
                parent.id
            ),
        ));
    }
    let existing_retry = db::execution::retry_of(&state.db, parent.id).await?.map(|e| e.id);
    recovery::manual_retry(&recovery::ManualRetryRequest {
        parent_id: parent.id,
        parent_status: parent.status,
        parent_action_ref: &parent.action_ref,
        existing_retry,
        action_ref: request.action_ref.as_deref(),
    })
    .map_err(refused)?;
    let parameters = match request.parameters {
        Some(given) => {
            let action = match parent.action {
                Some(id) => db::action::get(&state.db, id).await?,
                None => None,
            };
            let action = action.ok_or_else(|| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "action_not_found",
                    format!("action '{}' no longer exists", parent.action_ref),
                )
            })?;
            let specs: params::ParamSpecs = serde_json::from_value(action.parameters)
                .map_err(|e| ApiError::internal("stored parameter declarations are unreadable", e))?;
            let (given, kept_sealed) =
                if request.merge { merged(&parent.parameters, given) } else { (given, Map::new()) };
            let resolved = params::validate(&specs, &given)
                .map_err(|e| ApiError::invalid(&format!("parameters.{}", e.parameter), e.to_string()))?;
            within_limits(state, &resolved)?;
            secrets_for(state, &parent.action_ref, &resolved).await?;
            let mut resolved = sealed(state, &parent.action_ref, &specs, resolved)?;
            resolved.extend(kept_sealed);
            Some(Value::Object(resolved))
        }
        None => None,
    };
    let mut new =
        NewExecution::retry_of(&parent, ExecutionStatus::Requested, FailureKind::ManualRetry, parameters, None);
    if let Some(max_retries) = recovery::retry_budget(request.config.get("max_retries")).map_err(refused)? {
        new.max_retries = max_retries;
    }
    for (key, value) in request.config {
        // (the reason is the operator's retry; the platform's count is the RetryManager's alone)
        if key != "retry_reason" && key != "platform_retries" {
            new.config[key] = value;
        }
    }
    Ok(new)
}

/// Cancels an execution that has not finished: a queued one never runs; a running one's process
/// group is killed by its worker (through a cancel notice). Canceled executions are never retried
/// automatically.
#[utoipa::path(post, path = "/executions/{id}/cancel", operation_id = "cancel_execution", tag = "executions", params(("id" = i64, Path, description = "Execution id")),
    responses((status = 200, description = "The canceled execution", body = Execution),
        (status = 404, description = "No such execution", body = crate::openapi::ErrorBody),
        (status = 409, description = "Already finished", body = crate::openapi::ErrorBody),))]
pub async fn cancel(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    id: Result<Path<i64>, PathRejection>,
) -> Result<(Extension<Target>, Json<Execution>), ApiError> {
    let Path(id) = id?;
    let by = caller.token_id;
    let mut transaction = state.db.begin().await?;
    // (the reason given is the execution's, as an operator's fail records its own)
    let error = match asking.reason() {
        Some(reason) => format!("canceled by a client: {reason}"),
        None => "canceled by a client".to_string(),
    };
    let (canceled, was) =
        end_by_hand(&mut transaction, id, by, FailureKind::Canceled, error, "canceled", |_| Ok(())).await?;
    let target = asking.commit(transaction, StatusCode::OK, Target::default()).await?;
    stop_if_running(&state, &canceled).await;
    tracing::info!(execution_id = id, %was, token_id = by, "execution canceled");
    Ok((target, Json(canceled)))
}

/// Ends an unfinished execution by hand (a cancel, an operator's fail) for the token `by`, in
/// `transaction` (which the caller commits with its audit row): `check` sees it first, then the
/// guarded transition to the status of `kind` (`canceled`, else `failed`) records `kind` and
/// `error`, and `ended_by`. Returns the ended row and the status it had; once committed, the
/// worker it names is told to stop (`stop_if_running`).
async fn end_by_hand(
    transaction: &mut sqlx::PgConnection,
    id: i64,
    by: i64,
    kind: FailureKind,
    error: String,
    done: &str,
    check: impl FnOnce(&Execution) -> Result<(), ApiError>,
) -> Result<(Execution, ExecutionStatus), ApiError> {
    let current = find_on(&mut *transaction, id).await?;
    if current.status.is_terminal() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_finished",
            format!("execution {id} already finished ({})", current.status),
        ));
    }
    check(&current)?;
    let to = if kind == FailureKind::Canceled { ExecutionStatus::Canceled } else { ExecutionStatus::Failed };
    let outcome = db::execution::Outcome { failure_kind: Some(kind), error: Some(error), ..Default::default() };
    let transition = db::execution::Transition::to(to).outcome(&outcome);
    let Some(mut ended) = db::execution::transition(&mut *transaction, id, &transition).await? else {
        let now = find_on(&mut *transaction, id).await?;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_finished",
            format!("execution {id} finished ({}) before it could be {done}", now.status),
        ));
    };
    db::execution::api::record_ended_by(&mut *transaction, id, by).await?;
    ended.ended_by = Some(by);
    Ok((ended, current.status))
}

/// After an execution ended by hand is committed: the worker it names, if any, is told to stop it.
async fn stop_if_running(state: &crate::AppState, ended: &Execution) {
    if ended.worker.is_some() {
        stop_on_worker(state, ended.id).await;
    }
}

/// Tells the workers to stop `id` if one runs it (`Publisher::send_cancel_notice`).
async fn stop_on_worker(state: &crate::AppState, id: i64) {
    state.publisher.send_cancel_notice(id).await;
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailBody {
    /// Why the operator fails it; recorded in the execution's `error`.
    #[schema(min_length = 1, pattern = r"^[^\x00]*$")]
    pub reason: String,
}

/// Fails a stuck execution by hand (the quick reference's "manually fail execution if stuck"):
/// a non-terminal execution becomes `failed` with the kind `operator_failed` and the reason in its
/// `error`, through the guarded transition; it is never retried automatically, and the worker
/// running it, if any, is told to stop. A `delayed` retry is not stuck (cancel it instead).
#[utoipa::path(post, path = "/executions/{id}/fail", operation_id = "fail_execution", tag = "executions", params(("id" = i64, Path, description = "Execution id")),
    request_body = FailBody,
    responses((status = 200, description = "The failed execution", body = Execution),
        (status = 404, description = "No such execution", body = crate::openapi::ErrorBody),
        (status = 409, description = "Already finished (`already_finished`), or a delayed retry (`not_stuck`)", body = crate::openapi::ErrorBody),))]
pub async fn fail(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    id: Result<Path<i64>, PathRejection>,
    crate::error::JsonObject(body): crate::error::JsonObject<FailBody>,
) -> Result<(Extension<Target>, Json<Execution>), ApiError> {
    let Path(id) = id?;
    crate::error::storable("reason", &body.reason)?;
    if body.reason.is_empty() {
        return Err(ApiError::invalid("reason", "'reason' must say why the execution is failed"));
    }
    let error = format!("failed by an operator: {}", body.reason);
    let by = caller.token_id;
    let mut transaction = state.db.begin().await?;
    let (failed, was) =
        end_by_hand(&mut transaction, id, by, FailureKind::OperatorFailed, error, "failed", stuck).await?;
    let target = asking.commit(transaction, StatusCode::OK, Target::reason(&body.reason)).await?;
    stop_if_running(&state, &failed).await;
    tracing::warn!(execution_id = id, %was, reason = %body.reason, token_id = by, "execution failed by an operator");
    Ok((target, Json(failed)))
}

/// What an operator's fail checks first: a delayed retry waits out its backoff, it is not stuck
/// (`409 not_stuck`: cancel it to stop it).
fn stuck(current: &Execution) -> Result<(), ApiError> {
    if current.status == ExecutionStatus::Delayed {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_stuck",
            format!("execution {} is a retry waiting out its backoff, not stuck: cancel it to stop it", current.id),
        ));
    }
    Ok(())
}

/// A refused manual retry as the API answers it.
fn refused(refusal: recovery::ManualRetryRefusal) -> ApiError {
    use recovery::ManualRetryRefusal::*;
    let message = refusal.to_string();
    match refusal {
        NotTerminal { .. } => ApiError::new(StatusCode::CONFLICT, "not_terminal", message),
        AlreadyRetried { id, retry } => already_retried(id, retry),
        OtherAction { .. } => ApiError::invalid("action_ref", message),
        MaxRetriesOutOfRange => ApiError::invalid("config.max_retries", message),
    }
}

fn already_retried(parent: i64, existing: i64) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "already_retried",
        format!("execution {parent} was already retried by execution {existing}"),
    )
    .with_extra(serde_json::json!({"retry_execution": existing}))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// One of the execution statuses.
    #[param(value_type = Option<ExecutionStatus>)]
    pub status: Option<String>,
    #[param(pattern = r"^[^\x00]*$")]
    pub action_ref: Option<String>,
    /// RFC 3339 time.
    #[param(value_type = Option<DateTime<Utc>>)]
    pub created_after: Option<String>,
    /// RFC 3339 time.
    #[param(value_type = Option<DateTime<Utc>>)]
    pub created_before: Option<String>,
    /// 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Rows to skip, at most 10000; page further with `cursor`.
    #[param(minimum = 0, maximum = 10000)]
    pub offset: Option<i64>,
    /// Where the page starts: the `next_cursor` of the page before (the pages of one cursor
    /// chain neither repeat nor skip a row as new executions arrive). With `offset`, that many
    /// rows past the cursor are skipped.
    #[param(pattern = r"^[1-9][0-9]{0,18}$")]
    pub cursor: Option<String>,
    /// `summary` (the default): each row without `parameters`, `config`, `result`, `stdout`,
    /// `stderr` and `retry_decision`; `full`: each row whole. Either way a page holds about
    /// `ATTUNE_API_LIST_BUDGET_BYTES` of rows at most (`truncated`, `next_offset`).
    #[param(value_type = Option<ListFields>)]
    pub fields: Option<ListFields>,
}

/// Which fields the rows of a list page carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListFields {
    #[default]
    Summary,
    Full,
}

/// A row of a list page: an `ExecutionSummary` (no heavy field), or with `fields=full` the whole
/// `Execution`, as `GET /executions/{id}` has it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
// (a page's rows live only until they are serialized: boxing the larger one would buy nothing)
#[allow(clippy::large_enum_variant)]
pub enum ListedExecution {
    Summary(db::execution::api::ExecutionSummary),
    Full(Execution),
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// The executions matching the filter, counted up to 10000: with `total_exact` false there
    /// are at least this many (counting further would read the whole history).
    pub total: i64,
    pub total_exact: bool,
    pub limit: i64,
    pub offset: i64,
    /// Where the next page starts (`offset` plus the rows of this one); null on the last page.
    pub next_offset: Option<i64>,
    /// The `cursor` of the next page; null on the last page.
    pub next_cursor: Option<String>,
    /// True when the byte budget (`ATTUNE_API_LIST_BUDGET_BYTES`) ended this page before its
    /// `limit`: fewer rows than asked for, and more follow from `next_offset`.
    pub truncated: bool,
}

/// The id a `cursor` stands for: a positive whole number; one past every id there can be (as
/// many digits as the pattern allows) starts from the newest row.
fn cursor_id(cursor: &str) -> Result<i64, ApiError> {
    let digits = !cursor.is_empty() && cursor.len() <= 19 && cursor.bytes().all(|b| b.is_ascii_digit());
    match cursor.parse::<u64>() {
        Ok(id) if digits && id > 0 => Ok(i64::try_from(id).unwrap_or(i64::MAX)),
        _ => Err(ApiError::invalid("cursor", "'cursor' must be a page's 'next_cursor' (a positive whole number)")),
    }
}

/// What a page's own fields take besides its rows, reserved from the budget.
pub(crate) const PAGE_ENVELOPE_BYTES: usize = 256;
/// What a full row takes besides its heavy fields, for the estimate made before reading them.
pub(crate) const ROW_OVERHEAD_BYTES: usize = 1024;

/// How many rows, of the sizes given in page order, a page of `budget` bytes holds: as many as
/// fit, and at least one (a row larger than the budget comes alone, so paging always advances).
pub fn within_budget(sizes: impl IntoIterator<Item = usize>, budget: usize) -> usize {
    let (mut used, mut count) = (0usize, 0usize);
    for size in sizes {
        used = used.saturating_add(size);
        if count > 0 && used > budget {
            break;
        }
        count += 1;
    }
    count
}

fn timestamp(parameter: &str, value: Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    value
        .map(|text| {
            DateTime::parse_from_rfc3339(&text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| ApiError::invalid(parameter, format!("'{parameter}' must be an RFC 3339 time: {e}")))
        })
        .transpose()
}

#[utoipa::path(get, path = "/executions", operation_id = "list_executions", tag = "executions", params(ListQuery),
    responses((status = 200, description = "Newest first; without `fields=full` the rows leave out their heavy fields, and a page holds about `ATTUNE_API_LIST_BUDGET_BYTES` of rows at most", body = Page<ListedExecution>),
        (status = 400, description = "Malformed query", body = crate::openapi::ErrorBody),
        (status = 422, description = "A filter is invalid; `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn list(
    State(state): State<crate::State>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Page<Box<serde_json::value::RawValue>>>, ApiError> {
    let Query(query) = query?;
    if let Some(action_ref) = &query.action_ref {
        crate::error::storable("action_ref", action_ref)?;
    }
    let status = query
        .status
        .map(|s| {
            ExecutionStatus::parse(&s).ok_or_else(|| {
                let known: Vec<&str> = ExecutionStatus::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::invalid("status", format!("unknown status '{s}' (expected one of: {})", known.join(", ")))
            })
        })
        .transpose()?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "'limit' must be between 1 and 1000"));
    }
    let offset = query.offset.unwrap_or(0);
    if !(0..=MAX_OFFSET).contains(&offset) {
        return Err(ApiError::invalid(
            "offset",
            format!(
                "'offset' must be between 0 and {MAX_OFFSET}; page further with 'cursor' (each page's 'next_cursor')"
            ),
        ));
    }
    let before_id = query.cursor.as_deref().map(cursor_id).transpose()?;
    // one row more than the page holds tells whether another page follows
    let filter = ListFilter {
        status,
        action_ref: query.action_ref,
        created_after: timestamp("created_after", query.created_after)?,
        created_before: timestamp("created_before", query.created_before)?,
        before_id,
        limit: limit + 1,
        offset,
    };
    let budget = state.settings.http.list_budget_bytes.saturating_sub(PAGE_ENVELOPE_BYTES);
    // the rows the page could hold, and those read: full rows are weighed in the database
    // first, so that no more of them are read than the budget may take
    let (available, more, rows, total) = match query.fields.unwrap_or_default() {
        ListFields::Summary => {
            let (mut rows, total) = db::execution::api::list_summaries(&state.db, &filter).await?;
            let more = rows.len() as i64 > limit;
            rows.truncate(limit as usize);
            (rows.len(), more, rows.into_iter().map(ListedExecution::Summary).collect::<Vec<_>>(), total)
        }
        ListFields::Full => {
            let mut sizes = db::execution::api::list_sizes(&state.db, &filter).await?;
            let more = sizes.len() as i64 > limit;
            sizes.truncate(limit as usize);
            let fit = within_budget(sizes.iter().map(|s| *s as usize + ROW_OVERHEAD_BYTES), budget);
            let (rows, total) =
                db::execution::api::list(&state.db, &ListFilter { limit: fit as i64, ..filter }).await?;
            (sizes.len(), more, rows.into_iter().map(ListedExecution::Full).collect(), total)
        }
    };
    let ids: Vec<i64> = rows.iter().map(ListedExecution::id).collect();
    // and as sent: the estimate cannot know how much JSON escaping adds
    let mut items = rows
        .iter()
        .map(serde_json::value::to_raw_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::internal("an execution did not serialize", e))?;
    items.truncate(within_budget(items.iter().map(|item| item.get().len() + 1), budget));
    let returned = items.len() as i64;
    let truncated = items.len() < available;
    let follows = truncated || more;
    let next_offset = (follows && before_id.is_none()).then_some(offset + returned);
    let next_cursor = follows.then(|| ids.get(items.len().saturating_sub(1)).map(i64::to_string)).flatten();
    let total_exact = total <= db::execution::api::LIST_TOTAL_CAP;
    let total = total.min(db::execution::api::LIST_TOTAL_CAP);
    Ok(Json(Page { items, total, total_exact, limit, offset, next_offset, next_cursor, truncated }))
}

/// The deepest `offset` a list page takes (an offset is read past, row by row).
pub const MAX_OFFSET: i64 = 10_000;

impl ListedExecution {
    fn id(&self) -> i64 {
        match self {
            ListedExecution::Summary(row) => row.id,
            ListedExecution::Full(row) => row.id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::within_budget;

    #[test]
    fn a_page_holds_the_rows_that_fit_and_at_least_one() {
        let cases: [(&[usize], usize, usize); 7] = [
            (&[], 100, 0),
            (&[10, 10, 10], 25, 2),
            (&[10, 10], 20, 2),
            (&[10, 10, 1], 20, 2),
            (&[100], 10, 1),
            (&[100, 1], 10, 1),
            (&[10, 100, 1], 50, 1),
        ];
        for (sizes, budget, expected) in cases {
            assert_eq!(within_budget(sizes.iter().copied(), budget), expected, "{sizes:?} in {budget}");
        }
        assert_eq!(within_budget([usize::MAX, usize::MAX], 10), 1, "sizes past usize do not wrap");
    }
}
