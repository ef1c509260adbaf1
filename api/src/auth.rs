//! Bearer-token authentication for `/api/v1`. Tokens are compared by their SHA-256 hash.
//!
//! A verified token is remembered (by hash) for `ATTUNE_TOKEN_CACHE_SECS`, so steady traffic costs no database
//! read per request; a revoked token is refused within that time. The token a request came with is
//! its `Caller`, a request extension that handlers read with `Extension<Caller>`.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::ApiError;

/// Who made an `/api/v1` request: the id of its verified token (`api_token.id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub token_id: i64,
}

/// Tokens verified recently, by hash: the caller each names, and until when to trust it.
pub type VerifiedTokens = Mutex<HashMap<Vec<u8>, (Caller, Instant)>>;

pub async fn require_token(
    State(state): State<crate::State>,
    mut request: Request,
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
    let cached = if ttl.is_zero() {
        None
    } else {
        let verified = state.verified_tokens.lock().expect("token cache poisoned");
        verified.get(&hash).and_then(|(caller, until)| (*until > now).then_some(*caller))
    };
    let caller = match cached {
        Some(caller) => caller,
        None => {
            let token_id = attune_common::db::token::verify(&state.db, token)
                .await?
                .ok_or_else(|| ApiError::unauthorized("unknown or revoked token"))?;
            let caller = Caller { token_id };
            let mut verified = state.verified_tokens.lock().expect("token cache poisoned");
            if verified.len() > 10_000 {
                verified.retain(|_, (_, until)| *until > now);
            }
            verified.insert(hash, (caller, now + ttl));
            caller
        }
    };
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}
