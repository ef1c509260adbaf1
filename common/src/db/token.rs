//! API tokens: random, shown once, stored as a SHA-256 hash, each with a role and an optional
//! expiry.
//!
//! Tokens carry 256 random bits, so a fast hash is enough (nothing to brute-force); a slow
//! password hash per request would cap the API at a few hundred requests per second.
//!
//! A token's `Role` says what it may call (the API's table of routes is `attune_api::roles`):
//! `read` reads, `operator` also submits, retries, cancels and fails executions, `admin` also
//! registers packs and manages tokens. Every token is made with the role its maker chose: there is
//! no default (`attune token create` requires `--role`; the column has no default since
//! `20261130000000_token_role_required.sql`). A token lives for the lifetime it was made with, or
//! `ATTUNE_TOKEN_DEFAULT_EXPIRY` when its maker gave none (unset: for ever). Tokens are revoked,
//! never deleted: executions name the token that submitted or ended them.

use chrono::{DateTime, Utc};
use rand::RngExt;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::{PgExecutor, PgPool};

pub const PREFIX: &str = "attune_";

/// The longest lifetime a token may be given: ten years.
pub const MAX_LIFETIME_SECS: i64 = 10 * 365 * 24 * 3600;

/// A token's lifetime as `--expires-in` and `ATTUNE_TOKEN_DEFAULT_EXPIRY` take it: a whole number
/// and a unit, `s`, `m`, `h`, `d` or `w` (`30d`, `12h`), from one second to ten years.
pub fn parse_lifetime(text: &str) -> Result<chrono::Duration, String> {
    let unit_at = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(unit_at);
    let number: i64 = number.parse().map_err(|_| format!("'{text}' is not a number and a unit (30d, 12h)"))?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("'{text}' has no unit of s, m, h, d or w (30d, 12h)")),
    };
    let secs = number.checked_mul(unit_secs).unwrap_or(i64::MAX);
    if !(1..=MAX_LIFETIME_SECS).contains(&secs) {
        return Err(format!("'{text}' is not between one second and ten years"));
    }
    Ok(chrono::Duration::seconds(secs))
}

/// `ATTUNE_TOKEN_DEFAULT_EXPIRY`: the lifetime of a token made without one (`None`: for ever).
pub fn default_lifetime(
    source: &dyn crate::config::Source,
) -> Result<Option<chrono::Duration>, crate::config::ConfigError> {
    const NAME: &str = "ATTUNE_TOKEN_DEFAULT_EXPIRY";
    crate::config::read_optional(source, NAME)
        .map(|text| {
            parse_lifetime(text.trim()).map_err(|reason| crate::config::ConfigError {
                name: NAME.into(),
                value: text,
                reason,
            })
        })
        .transpose()
}

/// What a token may do; each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Every GET under `/api/v1` but the token list.
    Read,
    /// Also submits, retries, cancels and fails executions.
    Operator,
    /// Also registers packs and creates, lists and revokes tokens.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Read, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role '{0}' (expected read, operator or admin)")]
pub struct UnknownRole(pub String);

impl std::str::FromStr for Role {
    type Err = UnknownRole;
    fn from_str(text: &str) -> Result<Role, UnknownRole> {
        Role::ALL.into_iter().find(|role| role.as_str() == text).ok_or_else(|| UnknownRole(text.to_string()))
    }
}

impl TryFrom<String> for Role {
    type Error = UnknownRole;
    fn try_from(text: String) -> Result<Role, UnknownRole> {
        text.parse()
    }
}

impl<'de> serde::Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Role, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

pub fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

fn generate() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let body: String = (0..43).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("{PREFIX}{body}")
}

/// A token as it is listed: everything but the token itself (which is never stored).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    #[sqlx(try_from = "String")]
    pub role: Role,
    pub created: DateTime<Utc>,
    /// When it stops working; null: never.
    pub expires: Option<DateTime<Utc>>,
    /// When it was revoked; null: it was not.
    pub revoked: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, name, role, created, expires, revoked";

/// Creates an `admin` token called `name` that never expires and returns it; only its hash is
/// stored.
pub async fn create(db: &PgPool, name: &str) -> Result<String, sqlx::Error> {
    create_with(db, name, Role::Admin, None).await.map(|(_, token)| token)
}

/// Creates a token called `name` with `role`, expiring at `expires` (if given); returns it as
/// listed and the token itself, which only this answer ever holds.
pub async fn create_with(
    db: impl PgExecutor<'_>,
    name: &str,
    role: Role,
    expires: Option<DateTime<Utc>>,
) -> Result<(TokenInfo, String), sqlx::Error> {
    let token = generate();
    let info = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO api_token (name, token_hash, role, expires) VALUES ($1, $2, $3, $4) RETURNING {COLUMNS}"
    )))
    .bind(name)
    .bind(hash(&token))
    .bind(role.as_str())
    .bind(expires)
    .fetch_one(db)
    .await?;
    Ok((info, token))
}

/// The id of the live token (not revoked, not expired) matching `token`, if any.
pub async fn verify(db: &PgPool, token: &str) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM api_token WHERE token_hash = $1 AND revoked IS NULL AND (expires IS NULL OR expires > now())",
    )
    .bind(hash(token))
    .fetch_optional(db)
    .await
}

/// The token matching `token` unless it was revoked, expired or not: the caller tells an expired
/// token (`expires`) from a live one by its own clock.
pub async fn unrevoked(db: impl PgExecutor<'_>, token: &str) -> Result<Option<TokenInfo>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM api_token WHERE token_hash = $1 AND revoked IS NULL"
    )))
    .bind(hash(token))
    .fetch_optional(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<TokenInfo>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM api_token WHERE id = $1")))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// Every token, revoked and expired ones too, oldest first.
pub async fn list(db: impl PgExecutor<'_>) -> Result<Vec<TokenInfo>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM api_token ORDER BY id"))).fetch_all(db).await
}

/// The tokens called `name`, oldest first (names need not be unique).
pub async fn named(db: impl PgExecutor<'_>, name: &str) -> Result<Vec<TokenInfo>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM api_token WHERE name = $1 ORDER BY id")))
        .bind(name)
        .fetch_all(db)
        .await
}

/// The names of the tokens `ids` (for showing who submitted or ended an execution).
pub async fn names(db: impl PgExecutor<'_>, ids: &[i64]) -> Result<Vec<(i64, String)>, sqlx::Error> {
    sqlx::query_as("SELECT id, name FROM api_token WHERE id = ANY($1)").bind(ids).fetch_all(db).await
}

/// Revokes token `id` (from now on it is refused; an API process that verified it recently may
/// trust it for up to `ATTUNE_TOKEN_CACHE_SECS` more) and returns it; a token revoked before keeps
/// its first revocation time. `None`: no such token.
pub async fn revoke(db: impl PgExecutor<'_>, id: i64) -> Result<Option<TokenInfo>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE api_token SET revoked = COALESCE(revoked, now()) WHERE id = $1 RETURNING {COLUMNS}"
    )))
    .bind(id)
    .fetch_optional(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_prefixed() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 43);
        assert_eq!(hash(&a).len(), 32);
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn roles_are_ordered_by_what_they_may_do_and_read_back_from_their_names() {
        assert!(Role::Read < Role::Operator && Role::Operator < Role::Admin);
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
            assert_eq!(serde_json::to_value(role).unwrap(), serde_json::json!(role.as_str()));
            assert_eq!(serde_json::from_value::<Role>(serde_json::json!(role.as_str())).unwrap(), role);
        }
        assert_eq!("Admin".parse::<Role>(), Err(UnknownRole("Admin".into())));
        assert!(serde_json::from_value::<Role>(serde_json::json!("root")).is_err());
    }
}
