//! Workers with their health as the scheduler sees it.

use attune_common::db;
use axum::Json;
use axum::extract::State;

use crate::ApiError;

#[utoipa::path(get, path = "/workers", operation_id = "list_workers", tag = "workers", responses((status = 200, body = Vec<db::worker::WorkerView>)))]
pub async fn list(State(state): State<crate::State>) -> Result<Json<Vec<db::worker::WorkerView>>, ApiError> {
    Ok(Json(db::worker::list(&state.db, &state.settings.health).await?))
}
