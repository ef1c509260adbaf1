//! Workers with their health as the scheduler sees it.

use attune_common::db;
use axum::Json;
use axum::extract::State;

use crate::ApiError;

#[utoipa::path(get, path = "/workers", operation_id = "list_workers", tag = "workers", responses((status = 200, body = Vec<db::worker::WorkerView>)))]
pub async fn list(State(state): State<crate::State>) -> Result<Json<Vec<db::worker::WorkerView>>, ApiError> {
    Ok(Json(db::worker::list(&state.db, &state.settings.health).await?))
}

/// The executors' settings in force: the global retry settings (`retry_config`) and the health
/// thresholds (`health_probe_config`), as the last executor to start wrote them.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
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
