//! Workers with their health as the scheduler sees it.

use attune_common::db;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::{Extension, Json};

use crate::ApiError;
use crate::audit::Target;

#[utoipa::path(get, path = "/workers", operation_id = "list_workers", tag = "workers", responses((status = 200, body = Vec<db::worker::WorkerView>)))]
pub async fn list(State(state): State<crate::State>) -> Result<Json<Vec<db::worker::WorkerView>>, ApiError> {
    Ok(Json(db::worker::list(&state.db, &state.settings.health).await?))
}

#[utoipa::path(put, path = "/workers/{name}/drain", operation_id = "drain_worker", tag = "workers",
    params(("name" = String, Path, min_length = 1, max_length = 255, description = "The worker's name")),
    responses((status = 200, description = "Drained: it finishes what it runs and holds, and is dispatched nothing new until undrained (drain every worker of a runtime and its requests fail as worker_unavailable after ATTUNE_WORKER_WAIT_SECS: pause the runtime to hold them)", body = db::worker::WorkerView),
        (status = 404, description = "No such worker", body = crate::openapi::ErrorBody),))]
pub async fn drain(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    name: Result<Path<String>, PathRejection>,
) -> Result<(Extension<Target>, Json<db::worker::WorkerView>), ApiError> {
    set_drained(&state, name, Some(caller.token_id)).await
}

#[utoipa::path(delete, path = "/workers/{name}/drain", operation_id = "undrain_worker", tag = "workers",
    params(("name" = String, Path, min_length = 1, max_length = 255, description = "The worker's name")),
    responses((status = 200, description = "Undrained: it is dispatched work again from the executors' next look (within a second)", body = db::worker::WorkerView),
        (status = 404, description = "No such worker", body = crate::openapi::ErrorBody),))]
pub async fn undrain(
    State(state): State<crate::State>,
    name: Result<Path<String>, PathRejection>,
) -> Result<(Extension<Target>, Json<db::worker::WorkerView>), ApiError> {
    set_drained(&state, name, None).await
}

async fn set_drained(
    state: &crate::AppState,
    name: Result<Path<String>, PathRejection>,
    by: Option<i64>,
) -> Result<(Extension<Target>, Json<db::worker::WorkerView>), ApiError> {
    let Path(name) = name?;
    crate::error::storable("name", &name)?;
    let worker = db::worker::set_drained(&state.db, &state.settings.health, &name, by)
        .await?
        .ok_or_else(|| ApiError::not_found("worker", format!("no worker named '{name}'")))?;
    tracing::info!(worker = %name, drained = by.is_some(), "worker drain set");
    Ok((Extension(Target::new(format!("worker:{name}"))), Json(worker)))
}

/// The executors' settings in force: the global retry settings (`retry_config`) and the health
/// thresholds (`health_probe_config`), as the last executor to start wrote them.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct EffectiveConfig {
    pub retry: db::worker::StoredRetryConfig,
    #[schema(value_type = Object)]
    pub health: serde_json::Value,
}

#[utoipa::path(get, path = "/config", operation_id = "get_config", tag = "workers", responses((status = 200, body = EffectiveConfig)))]
pub async fn config(State(state): State<crate::State>) -> Result<Json<EffectiveConfig>, ApiError> {
    let retry = db::worker::retry_config(&state.db).await?;
    let health = db::worker::health_config(&state.db).await?;
    Ok(Json(EffectiveConfig { retry, health }))
}
