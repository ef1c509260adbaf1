//! Packs and actions.

use std::path::PathBuf;

use attune_common::db;
use attune_common::pack::load_pack;
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use crate::ApiError;

#[utoipa::path(get, path = "/actions", tag = "catalog", responses((status = 200, body = Vec<db::action::Action>)))]
pub async fn list_actions(State(state): State<crate::State>) -> Result<Json<Vec<db::action::Action>>, ApiError> {
    Ok(Json(db::action::list(&state.db, None).await?))
}

#[utoipa::path(get, path = "/actions/{action_ref}", tag = "catalog", params(("action_ref" = String, Path, description = "pack.name", pattern = r"^[^\x00]*$")),
    responses((status = 200, body = db::action::Action),
        (status = 404, description = "No such action", body = crate::openapi::ErrorBody),
        (status = 422, description = "`action_ref` holds a NUL character", body = crate::openapi::ErrorBody),))]
pub async fn get_action(
    State(state): State<crate::State>,
    action_ref: Result<Path<String>, PathRejection>,
) -> Result<Json<db::action::Action>, ApiError> {
    let Path(action_ref) = action_ref?;
    crate::error::storable("action_ref", &action_ref)?;
    db::action::get_by_ref(&state.db, &action_ref)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("action", format!("action '{action_ref}' does not exist")))
}

#[utoipa::path(get, path = "/packs", tag = "catalog", responses((status = 200, body = Vec<db::pack::Pack>)))]
pub async fn list_packs(State(state): State<crate::State>) -> Result<Json<Vec<db::pack::Pack>>, ApiError> {
    Ok(Json(db::pack::list(&state.db).await?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterPack {
    /// The pack's directory as the API server (and the workers) see it: under
    /// `ATTUNE_PACKS_DIR`, absolute or relative to it.
    #[schema(min_length = 1, pattern = r"^[^\x00]*$")]
    pub path: String,
    /// Take over a ref already registered from another directory (it replaces the code its
    /// actions run).
    #[serde(default)]
    pub force: bool,
}

/// Registers or updates the pack at `path`, a directory under `ATTUNE_PACKS_DIR`. No pack there
/// is a 404; a path outside the packs directory (symbolic links followed) a 403; a ref
/// registered from another directory a 409 unless `force`; a pack that fails to load is a 422
/// naming the file, the field and the reason (never the file's content).
#[utoipa::path(post, path = "/packs", tag = "catalog", request_body = RegisterPack,
    responses((status = 201, body = db::pack::Pack),
        (status = 403, description = "`path` is not under the packs directory (`ATTUNE_PACKS_DIR`) once symbolic links are followed", body = crate::openapi::ErrorBody),
        (status = 404, description = "No pack at `path`: not a directory on the API server, or no `pack.yaml` in it", body = crate::openapi::ErrorBody),
        (status = 409, description = "The pack's ref is registered from another directory (`existing_path`); `force` takes it over", body = crate::openapi::ErrorBody),
        (status = 422, description = "The pack does not load (`file`, `field` and `reason` say why), or `path` is empty", body = crate::openapi::ErrorBody),))]
pub async fn register_pack(
    State(state): State<crate::State>,
    asking: crate::audit::Asking,
    crate::error::JsonObject(body): crate::error::JsonObject<RegisterPack>,
) -> Result<(StatusCode, axum::Extension<crate::audit::Target>, Json<db::pack::Pack>), ApiError> {
    use attune_common::pack::{PackLocationError, resolve_in_packs_dir};
    crate::error::storable("path", &body.path)?;
    if body.path.is_empty() {
        return Err(ApiError::invalid("path", "'path' must name the pack's directory"));
    }
    let dir = match resolve_in_packs_dir(&state.settings.common.packs_dir, &PathBuf::from(&body.path)) {
        Ok(dir) => dir,
        Err(e @ (PackLocationError::NotFound(_) | PackLocationError::NoPacksDir(..))) => {
            let mut error = ApiError::not_found("pack", format!("{e} on the API server"));
            error.parameter = Some("path".to_string());
            return Err(error);
        }
        Err(e @ PackLocationError::Outside { .. }) => {
            let mut error = ApiError::new(StatusCode::FORBIDDEN, "outside_packs_dir", e.to_string());
            error.parameter = Some("path".to_string());
            return Err(error);
        }
    };
    let pack = tokio::task::spawn_blocking(move || load_pack(&dir))
        .await
        .map_err(|e| ApiError::internal("pack loading panicked", e))?
        .map_err(|e| invalid_pack(&e))?;
    let mut transaction = state.db.begin().await?;
    let registered = if body.force {
        db::pack::register_replacing(&mut *transaction, &pack).await
    } else {
        db::pack::register(&mut *transaction, &pack).await
    };
    let mut registered = match registered {
        Ok(registered) => registered,
        Err(db::pack::RegisterError::Taken { pack_ref, existing }) => {
            let mut error = ApiError::new(
                StatusCode::CONFLICT,
                "pack_exists",
                format!(
                    "pack '{pack_ref}' is already registered from {existing}; register it from there, or give \
                     \"force\": true to take the ref over (its actions then run this directory's code)"
                ),
            )
            .with_extra(serde_json::json!({"existing_path": existing}));
            error.parameter = Some("path".to_string());
            return Err(error);
        }
        Err(db::pack::RegisterError::Invalid(e)) => return Err(invalid_pack(&e)),
        Err(db::pack::RegisterError::Database(e)) => return Err(e.into()),
    };
    let target = crate::audit::Target::new(format!("pack:{}", registered.pack_ref));
    let target = asking.commit(transaction, StatusCode::CREATED, target).await?;
    registered.warnings = pack.actions.iter().flat_map(|a| a.warnings.iter().cloned()).collect();
    state.actions.clear();
    tracing::info!(pack = %registered.pack_ref, actions = registered.action_count, "pack registered");
    Ok((StatusCode::CREATED, target, Json(registered)))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetConcurrency {
    /// At most this many of the action's executions scheduled or running at once (1 to 100000);
    /// null: no limit, whatever the pack declares.
    #[schema(minimum = 1, maximum = 100000)]
    pub limit: Option<i64>,
    /// Count the limit per value of this parameter (declared by the action, not secret).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255, pattern = r"^[^\x00]*$")]
    pub key: Option<String>,
    /// Why: shown with the policy, and in the audit trail.
    #[schema(min_length = 1, max_length = 1000, pattern = r"^[^\x00]*[^\s\x00][^\x00]*$")]
    pub reason: String,
}

/// Sets the action's concurrency policy in place of its pack's: what waits beyond the limit stays
/// `requested`, in its order, and is claimed as room comes free (no failure, no retry spent).
#[utoipa::path(put, path = "/actions/{action_ref}/concurrency", operation_id = "set_concurrency", tag = "catalog",
    params(("action_ref" = String, Path, description = "pack.name", pattern = r"^[^\x00]*$")),
    request_body = SetConcurrency,
    responses((status = 200, description = "The action with the policy in force from the executors' next claim", body = db::action::Action),
        (status = 404, description = "No such action", body = crate::openapi::ErrorBody),
        (status = 422, description = "`limit`, `key` or `reason` is invalid (`key` must be a declared parameter that is not secret); `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn set_concurrency(
    State(state): State<crate::State>,
    axum::Extension(caller): axum::Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    action_ref: Result<Path<String>, PathRejection>,
    crate::error::JsonObject(body): crate::error::JsonObject<SetConcurrency>,
) -> Result<(axum::Extension<crate::audit::Target>, Json<db::action::Action>), ApiError> {
    let Path(action_ref) = action_ref?;
    crate::error::storable("action_ref", &action_ref)?;
    crate::audit::body_reason(&body.reason)?;
    if let Some(key) = &body.key {
        crate::error::storable("key", key)?;
    }
    let action = db::action::get_by_ref(&state.db, &action_ref)
        .await?
        .ok_or_else(|| ApiError::not_found("action", format!("action '{action_ref}' does not exist")))?;
    match body.limit {
        Some(limit) => {
            let specs: attune_core::params::ParamSpecs = serde_json::from_value(action.parameters.clone())
                .map_err(|e| ApiError::internal("stored parameter declarations are unreadable", e))?;
            let policy = attune_core::pack::ConcurrencySpec { limit, key: body.key.clone() };
            policy.check(&specs).map_err(|(field, reason)| ApiError::invalid(field, reason))?;
        }
        None if body.key.is_some() => {
            return Err(ApiError::invalid("key", "'key' partitions a limit: give 'limit' too, or neither"));
        }
        None => {}
    }
    let set = db::action::ConcurrencySet {
        limit: body.limit,
        key: body.key,
        set_by: caller.token_id,
        set_at: chrono::Utc::now(),
        reason: body.reason.clone(),
    };
    let mut transaction = state.db.begin().await?;
    let action = db::action::set_concurrency(&mut *transaction, &action_ref, Some(&set))
        .await?
        .ok_or_else(|| ApiError::not_found("action", format!("action '{action_ref}' does not exist")))?;
    let target = crate::audit::Target {
        what: Some(format!("action:{action_ref}")),
        ..crate::audit::Target::reason(&body.reason)
    };
    let target = asking.commit(transaction, StatusCode::OK, target).await?;
    tracing::info!(action_ref = %action_ref, limit = ?set.limit, key = ?set.key, token_id = caller.token_id, reason = %set.reason, "concurrency policy set");
    Ok((target, Json(action)))
}

/// Ends the operator's policy: the pack's `concurrency:` block (or none) is in force again.
#[utoipa::path(delete, path = "/actions/{action_ref}/concurrency", operation_id = "clear_concurrency", tag = "catalog",
    params(("action_ref" = String, Path, description = "pack.name", pattern = r"^[^\x00]*$")),
    responses((status = 200, description = "The action with its pack's policy in force again", body = db::action::Action),
        (status = 404, description = "No such action, or no policy of an operator's on it", body = crate::openapi::ErrorBody),
        (status = 422, description = "`action_ref` holds a NUL character", body = crate::openapi::ErrorBody),))]
pub async fn clear_concurrency(
    State(state): State<crate::State>,
    axum::Extension(caller): axum::Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    action_ref: Result<Path<String>, PathRejection>,
) -> Result<(axum::Extension<crate::audit::Target>, Json<db::action::Action>), ApiError> {
    let Path(action_ref) = action_ref?;
    crate::error::storable("action_ref", &action_ref)?;
    let action = db::action::get_by_ref(&state.db, &action_ref)
        .await?
        .ok_or_else(|| ApiError::not_found("action", format!("action '{action_ref}' does not exist")))?;
    if action.concurrency_set.is_none() {
        return Err(ApiError::not_found(
            "concurrency",
            format!("action '{action_ref}' has no concurrency policy set by an operator (its pack's is in force)"),
        ));
    }
    let mut transaction = state.db.begin().await?;
    let action = db::action::set_concurrency(&mut *transaction, &action_ref, None)
        .await?
        .ok_or_else(|| ApiError::not_found("action", format!("action '{action_ref}' does not exist")))?;
    let target = crate::audit::Target::new(format!("action:{action_ref}"));
    let target = asking.commit(transaction, StatusCode::OK, target).await?;
    tracing::info!(action_ref = %action_ref, token_id = caller.token_id, "concurrency policy cleared");
    Ok((target, Json(action)))
}

/// `422 invalid_pack`, naming the file, the field and the reason.
fn invalid_pack(e: &attune_common::pack::PackError) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_pack", e.to_string()).with_extra(serde_json::json!({
        "file": e.file.display().to_string(),
        "field": e.field,
        "reason": e.reason,
    }))
}
