//! The secret store's table (`attune_common::secrets` seals and opens the values).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// A secret as it is listed: never its value.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SecretInfo {
    pub name: String,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
    /// The token that set it last.
    pub updated_by: Option<i64>,
}

/// Sets secret `name` to `sealed` (made or replaced); returns it as listed.
pub async fn set(db: impl sqlx::PgExecutor<'_>, name: &str, sealed: &[u8], by: i64) -> Result<SecretInfo, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO secret (name, sealed, updated_by) VALUES ($1, $2, $3) \
         ON CONFLICT (name) DO UPDATE SET sealed = EXCLUDED.sealed, updated = now(), updated_by = EXCLUDED.updated_by \
         RETURNING name, created, updated, updated_by",
    )
    .bind(name)
    .bind(sealed)
    .bind(by)
    .fetch_one(db)
    .await
}

/// Every secret, by name.
pub async fn list(db: &PgPool) -> Result<Vec<SecretInfo>, sqlx::Error> {
    sqlx::query_as("SELECT name, created, updated, updated_by FROM secret ORDER BY name").fetch_all(db).await
}

/// Deletes secret `name`; `false` if there was none.
pub async fn delete(db: impl sqlx::PgExecutor<'_>, name: &str) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query("DELETE FROM secret WHERE name = $1").bind(name).execute(db).await?.rows_affected() > 0)
}

/// The sealed values of the secrets `names` that are set and that the parameters of the
/// execution `execution_id` refer to, while it is scheduled or running (for a worker's login: on
/// one of its workers). The one way a worker reads the store (`run_secrets`).
pub async fn sealed_values(
    db: &PgPool,
    execution_id: i64,
    names: &[String],
) -> Result<Vec<(String, Vec<u8>)>, sqlx::Error> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as("SELECT name, sealed FROM run_secrets($1, $2)").bind(execution_id).bind(names).fetch_all(db).await
}
