//! Schedules (`db::schedule`): an action with its parameters, run at the occurrences of a cron
//! expression in a time zone, or once at an instant; each run created once by the executors,
//! recorded on its execution (`schedule`, `scheduled_for`).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use attune_common::db::{self, execution::NewExecution, schedule::NewSchedule, schedule::Schedule};
use attune_common::schedule::{CatchUp, GRACE, Timing};

use crate::ApiError;
use crate::audit::Target;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSchedule {
    /// Unique; how the schedule is named in its routes and on its executions' `config.schedule`.
    #[schema(min_length = 1, max_length = 255, pattern = r"^[^\x00/]*$")]
    pub name: String,
    /// The action, as `pack.name`.
    #[schema(pattern = r"^[^\x00]*$")]
    pub action_ref: String,
    /// Checked against the action's declared parameters now (defaults filled in, secret ones
    /// sealed), as a submission's are.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// A cron expression: 5 fields (minute hour day-of-month month day-of-week), or 6 with
    /// seconds first; `L`, `W`, `#`, names and `@daily`-style macros. Give `cron` or `at`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255, pattern = r"^[^\x00]*$")]
    pub cron: Option<String>,
    /// The IANA time zone `cron` is read in (default `UTC`).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64, pattern = r"^[^\x00]*$")]
    pub timezone: Option<String>,
    /// One instant to run at (RFC 3339), instead of `cron`; at most 60 s past.
    #[serde(default)]
    #[schema(format = DateTime, value_type = Option<String>)]
    pub at: Option<String>,
    /// What a look after an outage does with occurrences older than 60 s: `skip` them (the
    /// default) or run `once` for them all.
    #[serde(default)]
    pub catch_up: Option<CatchUp>,
    /// Made paused (nothing runs until it is resumed).
    #[serde(default)]
    pub paused: bool,
    /// Why: shown with the schedule, and in the audit trail.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 1000, pattern = r"^[^\x00]*[^\s\x00][^\x00]*$")]
    pub reason: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Schedules whose name comes after this one (the last name of the page before)
    #[param(max_length = 255, pattern = r"^[^\x00]*$")]
    pub after: Option<String>,
    /// At most this many (1 to 1000; 100 by default), and no more than
    /// `ATTUNE_API_LIST_BUDGET_BYTES` of them: ask again after the last name for the rest
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

#[utoipa::path(get, path = "/schedules", operation_id = "list_schedules", tag = "schedules", params(ListQuery),
    responses((status = 200, description = "Schedules by name, with their next and last run (a page: `after` the last name for the next)", body = Vec<Schedule>),
        (status = 422, description = "`limit` or `after` is invalid", body = crate::openapi::ErrorBody),))]
pub async fn list(
    State(state): State<crate::State>,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<Schedule>>, ApiError> {
    let axum::extract::Query(query) = query?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "'limit' must be between 1 and 1000"));
    }
    if let Some(after) = &query.after {
        crate::error::storable("after", after)?;
        if after.chars().count() > 255 {
            return Err(ApiError::invalid("after", "'after' is a schedule's name: at most 255 characters"));
        }
    }
    let mut schedules = db::schedule::list(&state.db, query.after.as_deref(), limit).await?;
    let budget = state.settings.http.list_budget_bytes.saturating_sub(1024);
    let sizes = schedules.iter().map(|s| serde_json::to_vec(s).map_or(0, |bytes| bytes.len()) + 1);
    schedules.truncate(crate::routes::executions::within_budget(sizes, budget));
    Ok(Json(schedules))
}

#[utoipa::path(post, path = "/schedules", operation_id = "create_schedule", tag = "schedules",
    request_body = CreateSchedule,
    responses((status = 201, description = "The schedule, with its first `next_run`", body = Schedule),
        (status = 404, description = "No such action", body = crate::openapi::ErrorBody),
        (status = 409, description = "A schedule of that name exists, or (`schedule_limit`) as many run as this token as `ATTUNE_SCHEDULES_PER_TOKEN` allows", body = crate::openapi::ErrorBody),
        (status = 413, description = "The parameters are too large; `parameter` names the one", body = crate::openapi::ErrorBody),
        (status = 422, description = "`name`, `cron`, `timezone`, `at`, `reason` or a parameter is invalid (both or neither of `cron` and `at`; an instant past; a `cron` more often than `ATTUNE_SCHEDULE_MIN_INTERVAL_SECS`); `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn create(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    crate::error::JsonObject(body): crate::error::JsonObject<CreateSchedule>,
) -> Result<(StatusCode, Extension<Target>, Json<Schedule>), ApiError> {
    let new = checked(&state, caller.token_id, &body).await?;
    let mut transaction = state.db.begin().await?;
    let made = db::schedule::count_made_by(&mut transaction, caller.token_id).await?;
    if made >= state.settings.schedules_per_token {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "schedule_limit",
            format!(
                "{made} schedules run as this token, the most ATTUNE_SCHEDULES_PER_TOKEN ({}) allows: delete one first",
                state.settings.schedules_per_token
            ),
        ));
    }
    let schedule = db::schedule::create(&mut *transaction, &new).await?.ok_or_else(|| {
        ApiError::new(StatusCode::CONFLICT, "schedule_exists", format!("a schedule named '{}' exists", body.name))
    })?;
    let target = Target { what: Some(format!("schedule:{}", schedule.name)), written: false, reason: body.reason };
    let target = asking.commit(transaction, StatusCode::CREATED, target).await?;
    tracing::info!(schedule = %schedule.name, action_ref = %schedule.action_ref, next_run = ?schedule.next_run, token_id = caller.token_id, "schedule made");
    Ok((StatusCode::CREATED, target, Json(schedule)))
}

/// The schedule `body` describes, every field checked (its parameters as a submission's, sealed),
/// run as token `by`.
async fn checked(state: &crate::AppState, by: i64, body: &CreateSchedule) -> Result<NewSchedule, ApiError> {
    check_name(&body.name)?;
    if let Some(reason) = &body.reason {
        crate::audit::body_reason(reason)?;
    }
    let timezone = body.timezone.clone().unwrap_or_else(|| "UTC".into());
    crate::error::storable("timezone", &timezone)?;
    let now = Utc::now();
    // (read here, not by the body's parser: a malformed instant is refused naming 'at')
    let at = body
        .at
        .as_deref()
        .map(|at| {
            DateTime::parse_from_rfc3339(at).map(|at| at.with_timezone(&Utc)).map_err(|e| {
                ApiError::invalid(
                    "at",
                    format!("'at' ({at}) is not an RFC 3339 instant such as 2026-12-01T03:00:00Z: {e}"),
                )
            })
        })
        .transpose()?;
    let next_run = match (&body.cron, at) {
        (Some(cron), None) => {
            crate::error::storable("cron", cron)?;
            let timing = Timing::cron(cron, &timezone).map_err(|(field, reason)| ApiError::invalid(field, reason))?;
            let least =
                chrono::Duration::from_std(state.settings.schedule_min_interval).unwrap_or(chrono::Duration::MAX);
            if let Some(gap) = timing.shortest_gap(now, 1000)
                && gap < least
            {
                return Err(ApiError::invalid(
                    "cron",
                    format!(
                        "'{cron}' runs {} s apart, more often than ATTUNE_SCHEDULE_MIN_INTERVAL_SECS ({} s) allows",
                        gap.num_milliseconds() as f64 / 1000.0,
                        least.num_seconds()
                    ),
                ));
            }
            timing.first_after(now)
        }
        (None, Some(at)) => {
            if body.timezone.is_some() {
                return Err(ApiError::invalid(
                    "timezone",
                    "'timezone' reads a cron expression; 'at' carries its own offset",
                ));
            }
            if at < now - GRACE {
                return Err(ApiError::invalid("at", format!("'at' ({at}) has passed")));
            }
            Some(at)
        }
        _ => return Err(ApiError::invalid("cron", "give either 'cron' (with 'timezone') or 'at', not both")),
    };
    let planned = crate::routes::executions::plan(
        state,
        crate::routes::executions::CreateExecution {
            action_ref: body.action_ref.clone(),
            parameters: body.parameters.clone(),
            config: None,
        },
    )
    .await?;
    let new = NewSchedule {
        name: body.name.clone(),
        action_ref: planned.action_ref,
        parameters: planned.parameters,
        cron: body.cron.clone(),
        timezone,
        at,
        catch_up: body.catch_up.unwrap_or(CatchUp::Skip),
        paused: body.paused,
        next_run,
        reason: body.reason.clone(),
        created_by: by,
    };
    Ok(new)
}

fn check_name(name: &str) -> Result<(), ApiError> {
    crate::error::storable("name", name)?;
    if name.is_empty() || name.chars().count() > 255 || name.contains('/') {
        return Err(ApiError::invalid("name", "'name' must be 1 to 255 characters, without '/'"));
    }
    Ok(())
}

fn named(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(name) = path?;
    check_name(&name)?;
    Ok(name)
}

fn no_such(name: &str) -> ApiError {
    ApiError::not_found("schedule", format!("no schedule named '{name}'"))
}

#[utoipa::path(get, path = "/schedules/{name}", operation_id = "get_schedule", tag = "schedules",
    params(("name" = String, Path, min_length = 1, max_length = 255, pattern = r"^[^\x00/]*$")),
    responses((status = 200, body = Schedule),
        (status = 404, description = "No such schedule", body = crate::openapi::ErrorBody),
        (status = 422, description = "`name` is invalid", body = crate::openapi::ErrorBody),))]
pub async fn get(
    State(state): State<crate::State>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Schedule>, ApiError> {
    let name = named(name)?;
    db::schedule::get(&state.db, &name).await?.map(Json).ok_or_else(|| no_such(&name))
}

#[utoipa::path(put, path = "/schedules/{name}", operation_id = "replace_schedule", tag = "schedules",
    params(("name" = String, Path, min_length = 1, max_length = 255, pattern = r"^[^\x00/]*$")),
    request_body = CreateSchedule,
    responses((status = 200, description = "Changed: its action, parameters, timing, catch-up and reason are the body's; what it ran stays its own, and it runs as the token that changed it", body = Schedule),
        (status = 404, description = "No such schedule", body = crate::openapi::ErrorBody),
        (status = 422, description = "A field is invalid, as for a new schedule, or `name` is not the path's; `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn replace(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    name: Result<Path<String>, PathRejection>,
    crate::error::JsonObject(body): crate::error::JsonObject<CreateSchedule>,
) -> Result<(Extension<Target>, Json<Schedule>), ApiError> {
    let name = named(name)?;
    if body.name != name {
        return Err(ApiError::invalid(
            "name",
            format!("the body names '{}', the path '{name}': a schedule keeps its name", body.name),
        ));
    }
    let new = checked(&state, caller.token_id, &body).await?;
    let mut transaction = state.db.begin().await?;
    let schedule = db::schedule::replace(&mut *transaction, &new).await?.ok_or_else(|| no_such(&name))?;
    let target = Target { what: Some(format!("schedule:{name}")), written: false, reason: body.reason };
    let target = asking.commit(transaction, StatusCode::OK, target).await?;
    tracing::info!(schedule = %name, next_run = ?schedule.next_run, token_id = caller.token_id, "schedule changed");
    Ok((target, Json(schedule)))
}

#[utoipa::path(post, path = "/schedules/{name}/run", operation_id = "run_schedule_now", tag = "schedules",
    params(("name" = String, Path, min_length = 1, max_length = 255, pattern = r"^[^\x00/]*$")),
    responses((status = 201, description = "Run now, once, outside its timing (its next run stays): the execution made, the schedule's, submitted by the caller", body = attune_common::db::execution::Execution),
        (status = 404, description = "No such schedule", body = crate::openapi::ErrorBody),
        (status = 409, description = "Its action is not registered (any more)", body = crate::openapi::ErrorBody),
        (status = 422, description = "`name` is invalid", body = crate::openapi::ErrorBody),))]
pub async fn run_now(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    name: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Extension<Target>, Json<attune_common::db::execution::Execution>), ApiError> {
    let name = named(name)?;
    // (the schedule and its action read in the run's transaction: a schedule deleted meanwhile
    // makes no run, and the action is the one registered now)
    let mut transaction = state.db.begin().await?;
    let schedule = db::schedule::get_to_run(&mut *transaction, &name).await?.ok_or_else(|| no_such(&name))?;
    let Some(action) = db::action::get_by_ref(&mut *transaction, &schedule.action_ref).await? else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "action_not_found",
            format!("schedule '{name}' runs {}, which is not registered", schedule.action_ref),
        ));
    };
    // (its parameters as stored, sealed ones as they are: they were checked when it was made;
    // its time the database's, as an occurrence's is)
    let now = db::now(&mut *transaction).await?;
    let default_timeout = state.settings.common.default_timeout_secs;
    let new = NewExecution::first_attempt(
        &action,
        schedule.parameters,
        serde_json::json!({"run_now": true}),
        default_timeout,
    )
    .of_schedule(schedule.id, &schedule.name, now);
    let execution = db::execution::insert_submitted(&mut *transaction, &new, Some(caller.token_id)).await?;
    let id = execution.id;
    let target = Target::new(format!("execution:{id}"));
    let target = asking.commit(transaction, StatusCode::CREATED, target).await?;
    tracing::info!(schedule = %name, execution_id = id, token_id = caller.token_id, "schedule run now");
    Ok((StatusCode::CREATED, target, Json(execution)))
}

#[utoipa::path(delete, path = "/schedules/{name}", operation_id = "delete_schedule", tag = "schedules",
    params(("name" = String, Path, min_length = 1, max_length = 255, pattern = r"^[^\x00/]*$")),
    responses((status = 200, description = "Deleted: the schedule as it was (its executions keep its id)", body = Schedule),
        (status = 404, description = "No such schedule", body = crate::openapi::ErrorBody),
        (status = 422, description = "`name` is invalid", body = crate::openapi::ErrorBody),))]
pub async fn delete(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    name: Result<Path<String>, PathRejection>,
) -> Result<(Extension<Target>, Json<Schedule>), ApiError> {
    let name = named(name)?;
    let mut transaction = state.db.begin().await?;
    let schedule = db::schedule::delete(&mut *transaction, &name).await?.ok_or_else(|| no_such(&name))?;
    let target = asking.commit(transaction, StatusCode::OK, Target::default()).await?;
    tracing::info!(schedule = %name, token_id = caller.token_id, "schedule deleted");
    Ok((target, Json(schedule)))
}

#[utoipa::path(post, path = "/schedules/{name}/pause", operation_id = "pause_schedule", tag = "schedules",
    params(("name" = String, Path, min_length = 1, max_length = 255, pattern = r"^[^\x00/]*$")),
    responses((status = 200, description = "Paused: no run is created until it is resumed", body = Schedule),
        (status = 404, description = "No such schedule", body = crate::openapi::ErrorBody),
        (status = 422, description = "`name` is invalid", body = crate::openapi::ErrorBody),))]
pub async fn pause(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    name: Result<Path<String>, PathRejection>,
) -> Result<(Extension<Target>, Json<Schedule>), ApiError> {
    let name = named(name)?;
    let mut transaction = state.db.begin().await?;
    let paused = db::schedule::set_paused(&mut *transaction, &name, true, caller.token_id, |_| None).await?;
    let schedule = paused.ok_or_else(|| no_such(&name))?;
    let target = asking.commit(transaction, StatusCode::OK, Target::default()).await?;
    Ok((target, Json(schedule)))
}

#[utoipa::path(post, path = "/schedules/{name}/resume", operation_id = "resume_schedule", tag = "schedules",
    params(("name" = String, Path, min_length = 1, max_length = 255, pattern = r"^[^\x00/]*$")),
    responses((status = 200, description = "Resumed: a cron schedule runs from its next occurrence after now (what came while it was paused is not run); an instant that passed meanwhile follows its catch_up. It runs as the token that resumed it from now on (`created_by`), and its `paused_reason` is cleared", body = Schedule),
        (status = 404, description = "No such schedule", body = crate::openapi::ErrorBody),
        (status = 422, description = "`name` is invalid", body = crate::openapi::ErrorBody),))]
pub async fn resume(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    name: Result<Path<String>, PathRejection>,
) -> Result<(Extension<Target>, Json<Schedule>), ApiError> {
    let name = named(name)?;
    let mut transaction = state.db.begin().await?;
    let resumed = db::schedule::set_paused(&mut *transaction, &name, false, caller.token_id, |s| match s.timing() {
        Ok(Timing::At(at)) => s.next_run.map(|_| at),
        Ok(timing) => timing.first_after(Utc::now()),
        Err(_) => None,
    });
    let schedule = resumed.await?.ok_or_else(|| no_such(&name))?;
    let target = asking.commit(transaction, StatusCode::OK, Target::default()).await?;
    Ok((target, Json(schedule)))
}
