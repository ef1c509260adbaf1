//! Pause and resume an action or a whole runtime (`db::pause`): its requests wait, `requested`,
//! until it is resumed; nothing already running is touched and no retry is spent.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;

use attune_common::db::{self, pause::Pause, pause::PauseKind};

use crate::ApiError;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// Why: shown with the pause, and in the audit trail.
    #[schema(min_length = 1, max_length = 1000, pattern = r"^[^\x00]*[^\s\x00][^\x00]*$")]
    pub reason: String,
}

#[utoipa::path(get, path = "/pauses", operation_id = "list_pauses", tag = "pauses",
    responses((status = 200, description = "What is paused, oldest first, with why, by which token and since when", body = Vec<Pause>)))]
pub async fn list(State(state): State<crate::State>) -> Result<Json<Vec<Pause>>, ApiError> {
    Ok(Json(db::pause::list(&state.db).await?))
}

/// The kind and name of a pause's path, checked.
fn target(kind: &str, name: &str) -> Result<PauseKind, ApiError> {
    let kind = PauseKind::parse(kind)
        .ok_or_else(|| ApiError::invalid("kind", "'kind' must be 'action', 'runtime' or 'run'"))?;
    crate::error::storable("name", name)?;
    if name.is_empty() || name.chars().count() > 255 {
        return Err(ApiError::invalid("name", "'name' must be 1 to 255 characters"));
    }
    Ok(kind)
}

#[utoipa::path(put, path = "/pauses/{kind}/{name}", operation_id = "pause", tag = "pauses",
    params(("kind" = String, Path, description = "`action`, `runtime` or `run` (a workflow run, by its id: it starts no new step)", pattern = "^(action|runtime|run)$"),
        ("name" = String, Path, min_length = 1, max_length = 255, description = "The action's ref (`pack.name`), the runtime's name, or the workflow run's id")),
    request_body = PauseBody,
    responses((status = 201, description = "Paused: its requests wait from the executors' next claim", body = Pause),
        (status = 200, description = "Already paused: the reason is replaced, the pause keeps its start", body = Pause),
        (status = 404, description = "No such action, or (kind `run`) no such workflow run", body = crate::openapi::ErrorBody),
        (status = 422, description = "`kind`, `name` (an unknown runtime, or a run named by other than its id) or `reason` is invalid; `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn pause(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    path: Result<Path<(String, String)>, PathRejection>,
    crate::error::JsonObject(body): crate::error::JsonObject<PauseBody>,
) -> Result<(StatusCode, Extension<crate::audit::Target>, Json<Pause>), ApiError> {
    let Path((kind, name)) = path?;
    let kind = target(&kind, &name)?;
    crate::audit::body_reason(&body.reason)?;
    if kind == PauseKind::Action && state.actions.get_by_ref(&state.db, &name).await?.is_none() {
        return Err(ApiError::not_found("action", format!("action '{name}' does not exist")));
    }
    let runtimes = attune_core::pack::RUNTIMES;
    if kind == PauseKind::Runtime && !runtimes.contains(&name.as_str()) && name != attune_core::workflow::RUNTIME {
        return Err(ApiError::invalid(
            "name",
            format!(
                "unknown runtime '{name}' (expected one of: {}, {})",
                runtimes.join(", "),
                attune_core::workflow::RUNTIME
            ),
        ));
    }
    if kind == PauseKind::Run {
        let run = name.parse::<i64>().ok().filter(|id| *id > 0);
        let Some(run) = run else {
            return Err(ApiError::invalid("name", "a run's pause is named by the workflow run's id (an execution id)"));
        };
        if db::workflow::get(&state.db, run).await?.is_none() {
            return Err(ApiError::not_found("workflow run", format!("execution {run} is not a workflow run")));
        }
    }
    let mut transaction = state.db.begin().await?;
    let (pause, new, handed_back) =
        db::pause::pause(&mut *transaction, kind, &name, &body.reason, caller.token_id).await?;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    // (the row names what was paused, as a schedule's or an action's change names its object)
    let named = crate::audit::Target {
        reason: Some(body.reason.clone()),
        ..crate::audit::Target::new(format!("{}:{name}", kind.as_str()))
    };
    let target = asking.commit(transaction, status, named).await?;
    tracing::info!(kind = kind.as_str(), %name, reason = %body.reason, token_id = caller.token_id, handed_back, "paused");
    if handed_back > 0 {
        attune_common::metrics::increment(&attune_common::metrics::HANDED_BACK, &[("by", "pause")], handed_back as u64);
    }
    Ok((status, target, Json(pause)))
}

#[utoipa::path(delete, path = "/pauses/{kind}/{name}", operation_id = "resume", tag = "pauses",
    params(("kind" = String, Path, description = "`action`, `runtime` or `run` (a workflow run, by its id: it starts no new step)", pattern = "^(action|runtime|run)$"),
        ("name" = String, Path, min_length = 1, max_length = 255, description = "The action's ref (`pack.name`), the runtime's name, or the workflow run's id")),
    responses((status = 200, description = "Resumed: the pause it ended; its requests are claimed again within a second", body = Pause),
        (status = 404, description = "Not paused", body = crate::openapi::ErrorBody),
        (status = 422, description = "`kind` or `name` is invalid; `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn resume(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(Extension<crate::audit::Target>, Json<Pause>), ApiError> {
    let Path((kind, name)) = path?;
    let kind = target(&kind, &name)?;
    let mut transaction = state.db.begin().await?;
    let pause = db::pause::resume(&mut *transaction, kind, &name)
        .await?
        .ok_or_else(|| ApiError::not_found("pause", format!("{} '{name}' is not paused", kind.as_str())))?;
    let named = crate::audit::Target::new(format!("{}:{name}", kind.as_str()));
    let target = asking.commit(transaction, StatusCode::OK, named).await?;
    tracing::info!(kind = kind.as_str(), %name, token_id = caller.token_id, "resumed");
    Ok((target, Json(pause)))
}
