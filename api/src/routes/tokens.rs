//! API tokens: who the caller is (`whoami`, any role), and for admins the token list, new tokens
//! (shown once) and revocation. The CLI's `attune token` does the same through the database.

use attune_common::db::{self, token::Role, token::TokenInfo};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ApiError;
use crate::auth::Caller;

/// The longest lifetime a token can be given: 10 years.
pub const MAX_EXPIRES_IN_SECS: i64 = db::token::MAX_LIFETIME_SECS;

/// The token a request came with.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WhoAmI {
    pub token_id: i64,
    pub name: String,
    pub role: Role,
    /// When the token stops working; null: never.
    pub expires: Option<DateTime<Utc>>,
}

/// Who is calling: the token's id, name and role (the dashboard hides what the role may not do).
#[utoipa::path(get, path = "/whoami", operation_id = "whoami", tag = "tokens",
    responses((status = 200, body = WhoAmI)))]
pub async fn whoami(
    State(state): State<crate::State>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<WhoAmI>, ApiError> {
    // the token was verified a moment ago (or within the cache's time): one revoked since is
    // told as such
    let token = db::token::get(&state.db, caller.token_id)
        .await?
        .filter(|token| token.revoked.is_none())
        .ok_or_else(|| ApiError::unauthorized("unknown or revoked token"))?;
    Ok(Json(WhoAmI { token_id: token.id, name: token.name, role: token.role, expires: token.expires }))
}

/// Every token (revoked and expired ones too), oldest first; never the tokens themselves.
#[utoipa::path(get, path = "/tokens", operation_id = "list_tokens", tag = "tokens",
    responses((status = 200, body = Vec<TokenInfo>)))]
pub async fn list(State(state): State<crate::State>) -> Result<Json<Vec<TokenInfo>>, ApiError> {
    Ok(Json(db::token::list(&state.db).await?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// What the token is for (names need not be unique).
    #[schema(min_length = 1, max_length = 200, pattern = r"^[^\x00]*$")]
    pub name: String,
    /// What it may do.
    #[schema(value_type = Role)]
    pub role: String,
    /// Seconds until it expires (at most 10 years); left out or null: the API's
    /// `ATTUNE_TOKEN_DEFAULT_EXPIRY`, never when that is unset.
    // read as a number: JSON Schema's integers include `60.0`
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 315_360_000)]
    pub expires_in_secs: Option<f64>,
}

/// A new token: shown in this answer only (only its hash is stored).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub info: TokenInfo,
    /// The token, for `Authorization: Bearer <token>`.
    pub token: String,
}

/// Creates a token with a role and an optional lifetime, and answers with it, once.
#[utoipa::path(post, path = "/tokens", operation_id = "create_token", tag = "tokens", request_body = CreateToken,
    responses((status = 201, description = "The new token; `token` is shown this once", body = CreatedToken),
        (status = 422, description = "An empty or too long name, an unknown role or a lifetime out of range; `parameter` names it", body = crate::openapi::ErrorBody)))]
pub async fn create(
    State(state): State<crate::State>,
    asking: crate::audit::Asking,
    crate::error::JsonObject(body): crate::error::JsonObject<CreateToken>,
) -> Result<(StatusCode, Extension<crate::audit::Target>, Json<CreatedToken>), ApiError> {
    crate::error::storable("name", &body.name)?;
    if body.name.is_empty() || body.name.chars().count() > 200 {
        return Err(ApiError::invalid("name", "'name' must be 1 to 200 characters"));
    }
    let role: Role = body.role.parse().map_err(|e: db::token::UnknownRole| ApiError::invalid("role", e.to_string()))?;
    let expires = match body.expires_in_secs {
        None => state.settings.token_default_expiry.map(|lifetime| Utc::now() + lifetime),
        Some(secs) if secs.fract() == 0.0 && (1.0..=MAX_EXPIRES_IN_SECS as f64).contains(&secs) => {
            Some(Utc::now() + chrono::Duration::seconds(secs as i64))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "expires_in_secs",
                format!("'expires_in_secs' must be a whole number from 1 to {MAX_EXPIRES_IN_SECS} (10 years)"),
            ));
        }
    };
    let mut transaction = state.db.begin().await?;
    let (info, token) = db::token::create_with(&mut *transaction, &body.name, role, expires).await?;
    let target = crate::audit::Target::new(format!("token:{}", info.id));
    let target = asking.commit(transaction, StatusCode::CREATED, target).await?;
    tracing::info!(token_id = info.id, name = %info.name, role = %info.role, ?expires, "token created");
    Ok((StatusCode::CREATED, target, Json(CreatedToken { info, token })))
}

/// Revokes a token: it is refused from now on (by other API processes within
/// `ATTUNE_TOKEN_CACHE_SECS`). Revoking a revoked token changes nothing. The token the request
/// comes with is not revoked here, so that an admin does not lock itself out by a slip (another
/// admin token, or `attune token revoke`, does it).
#[utoipa::path(delete, path = "/tokens/{id}", operation_id = "revoke_token", tag = "tokens",
    params(("id" = i64, Path, description = "Token id")),
    responses((status = 200, description = "The revoked token; every schedule that ran as it is paused, its `paused_reason` saying why", body = TokenInfo),
        (status = 404, description = "No such token", body = crate::openapi::ErrorBody),
        (status = 409, description = "`own_token`: the token of this request", body = crate::openapi::ErrorBody)))]
pub async fn revoke(
    State(state): State<crate::State>,
    Extension(caller): Extension<Caller>,
    asking: crate::audit::Asking,
    id: Result<Path<i64>, PathRejection>,
) -> Result<(Extension<crate::audit::Target>, Json<TokenInfo>), ApiError> {
    let Path(id) = id?;
    if id == caller.token_id {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "own_token",
            format!(
                "token {id} is the one this request comes with: revoke it with another admin token or `attune token revoke`"
            ),
        ));
    }
    let mut transaction = state.db.begin().await?;
    let revoked = db::token::revoke(&mut *transaction, id)
        .await?
        .ok_or_else(|| ApiError::not_found("token", format!("token {id} does not exist")))?;
    // what ran as it stops with it (resumed, a schedule runs as whoever resumes it)
    let reason = format!("stopped: the token it runs as ({id}, '{}') was revoked", revoked.name);
    let stopped = db::schedule::pause_made_by(&mut *transaction, id, &reason).await?;
    let target = asking.commit(transaction, StatusCode::OK, Default::default()).await?;
    crate::auth::forget(&state.verified_tokens, id);
    tracing::info!(token_id = id, name = %revoked.name, by = caller.token_id, schedules_paused = ?stopped, "token revoked");
    Ok((target, Json(revoked)))
}
