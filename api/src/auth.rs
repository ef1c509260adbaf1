//! Bearer-token authentication for `/api/v1`. Tokens are compared by their SHA-256 hash.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::ApiError;

pub async fn require_token(
    State(state): State<crate::State>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing Authorization header (expected 'Bearer <token>')"))?;
    let token = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::unauthorized("malformed Authorization header (expected 'Bearer <token>')"))?;
    match attune_common::db::token::verify(&state.db, token).await? {
        Some(_) => Ok(next.run(request).await),
        None => Err(ApiError::unauthorized("unknown or revoked token")),
    }
}
