//! Bearer-token authentication for `/api/v1`. Tokens are compared by their SHA-256 hash.
//!
//! A verified token is remembered (by hash) for `ATTUNE_TOKEN_CACHE_SECS`, so steady traffic costs no database
//! read per request; a revoked token is refused within that time.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use std::time::Instant;

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
    let hash = attune_common::db::token::hash(token);
    let now = Instant::now();
    let ttl = state.settings.token_cache_ttl;
    let cached = !ttl.is_zero()
        && state.verified_tokens.lock().expect("token cache poisoned").get(&hash).is_some_and(|until| *until > now);
    if !cached {
        if attune_common::db::token::verify(&state.db, token).await?.is_none() {
            return Err(ApiError::unauthorized("unknown or revoked token"));
        }
        let mut verified = state.verified_tokens.lock().expect("token cache poisoned");
        if verified.len() > 10_000 {
            verified.retain(|_, until| *until > now);
        }
        verified.insert(hash, now + ttl);
    }
    Ok(next.run(request).await)
}
