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
        .map_err(|e| {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_pack", e.to_string()).with_extra(
                serde_json::json!({
                    "file": e.file.display().to_string(),
                    "field": e.field,
                    "reason": e.reason,
                }),
            )
        })?;
    let registered = if body.force {
        db::pack::register_replacing(&state.db, &pack).await
    } else {
        db::pack::register(&state.db, &pack).await
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
        Err(db::pack::RegisterError::Database(e)) => return Err(e.into()),
    };
    registered.warnings = pack.actions.iter().flat_map(|a| a.warnings.iter().cloned()).collect();
    state.actions.clear();
    tracing::info!(pack = %registered.pack_ref, actions = registered.action_count, "pack registered");
    let target = crate::audit::Target::new(format!("pack:{}", registered.pack_ref));
    Ok((StatusCode::CREATED, axum::Extension(target), Json(registered)))
}
