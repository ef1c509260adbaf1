//! Workers with their health as the scheduler sees it.

use attune_common::db;
use axum::Json;
use axum::extract::State;

use crate::ApiError;

pub async fn list(State(state): State<crate::State>) -> Result<Json<Vec<db::worker::WorkerView>>, ApiError> {
    Ok(Json(db::worker::list(&state.db, &state.settings.health).await?))
}
