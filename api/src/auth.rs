//! Bearer-token authentication for `/api/v1`. Tokens are compared by their SHA-256 hash.
//!
//! A verified token is remembered (by hash) for `ATTUNE_TOKEN_CACHE_SECS`, so steady traffic costs no database
//! read per request; a revoked token is refused within that time (at once on the API process that
//! revoked it). An expired token is refused (401 "token expired") from the moment it expires,
//! cached or not. The token a request came with is its `Caller`, a request extension that
//! handlers read with `Extension<Caller>`; what the caller's role may call is decided by `roles`.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use chrono::{DateTime, Utc};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use attune_common::db::token::Role;

use crate::ApiError;

/// Who made an `/api/v1` request: its verified token (`api_token.id`) and that token's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub token_id: i64,
    pub role: Role,
}

/// A token verified recently: the caller it names, when it expires, and until when to trust it
/// without reading the database again.
#[derive(Debug, Clone, Copy)]
pub struct Verified {
    caller: Caller,
    expires: Option<DateTime<Utc>>,
    trusted_until: Instant,
}

/// Tokens verified recently, by hash.
pub type VerifiedTokens = Mutex<HashMap<Vec<u8>, Verified>>;

/// Forgets token `token_id` (revoked through this process): its next request reads the database.
pub fn forget(verified: &VerifiedTokens, token_id: i64) {
    verified.lock().expect("token cache poisoned").retain(|_, v| v.caller.token_id != token_id);
}

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
        verified.get(&hash).copied().filter(|v| v.trusted_until > now)
    };
    let verified = match cached {
        Some(verified) => verified,
        None => {
            let token = attune_common::db::token::unrevoked(&state.db, token)
                .await?
                .ok_or_else(|| ApiError::unauthorized("unknown or revoked token"))?;
            let verified = Verified {
                caller: Caller { token_id: token.id, role: token.role },
                expires: token.expires,
                trusted_until: now + ttl,
            };
            if !ttl.is_zero() {
                let mut cache = state.verified_tokens.lock().expect("token cache poisoned");
                if cache.len() > 10_000 {
                    cache.retain(|_, v| v.trusted_until > now);
                }
                cache.insert(hash, verified);
            }
            verified
        }
    };
    if verified.expires.is_some_and(|expires| expires <= Utc::now()) {
        return Err(ApiError::unauthorized("token expired"));
    }
    if let Some(trust) = request.extensions().get::<crate::server::ConnectionTrust>() {
        trust.vouch();
    }
    request.extensions_mut().insert(verified.caller);
    Ok(next.run(request).await)
}
