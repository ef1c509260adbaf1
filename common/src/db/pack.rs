//! The pack table, and registering a loaded pack with its actions in one transaction.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::pack::LoadedPack;

#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Pack {
    pub id: i64,
    #[serde(rename = "ref")]
    #[sqlx(rename = "ref")]
    pub pack_ref: String,
    pub version: String,
    pub description: Option<String>,
    pub path: Option<String>,
    pub action_count: i64,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
    /// What the loader allowed but most likely is not meant (`retry.max_attempts: 0`, …), each
    /// naming its file and field; only in the answer to a registration.
    #[sqlx(skip)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

const SELECT: &str = "SELECT p.id, p.ref, p.version, p.description, p.path, \
    (SELECT count(*) FROM action a WHERE a.pack = p.id) AS action_count, p.created, p.updated FROM pack p";

/// Creates or updates the pack and its actions; actions no longer in the pack are removed
/// (executions keep their `action_ref`).
pub async fn register(db: &PgPool, pack: &LoadedPack) -> Result<Pack, sqlx::Error> {
    let mut tx = db.begin().await?;
    let path = std::fs::canonicalize(&pack.path).unwrap_or_else(|_| pack.path.clone());
    let pack_id: i64 = sqlx::query_scalar(
        "INSERT INTO pack (ref, version, description, path) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (ref) DO UPDATE SET version = $2, description = $3, path = $4, updated = now() \
         RETURNING id",
    )
    .bind(&pack.manifest.pack_ref)
    .bind(&pack.manifest.version)
    .bind(&pack.manifest.description)
    .bind(path.to_string_lossy().as_ref())
    .fetch_one(&mut *tx)
    .await?;
    let mut refs = Vec::new();
    for action in &pack.actions {
        let spec = &action.spec;
        sqlx::query(
            "INSERT INTO action (ref, pack, name, description, runtime, entrypoint, parameters, \
                timeout_seconds, max_retries, retry_policy, http) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (ref) DO UPDATE SET pack = $2, name = $3, description = $4, runtime = $5, \
                entrypoint = $6, parameters = $7, timeout_seconds = $8, max_retries = $9, \
                retry_policy = $10, http = $11, updated = now()",
        )
        .bind(&action.action_ref)
        .bind(pack_id)
        .bind(&spec.name)
        .bind(&spec.description)
        .bind(&spec.runtime)
        .bind(&spec.entrypoint)
        .bind(serde_json::to_value(&spec.parameters).expect("parameters serialize"))
        .bind(spec.timeout_seconds)
        .bind(spec.max_retries_in_force())
        .bind(spec.retry.as_ref().map(|r| serde_json::to_value(r).expect("retry policy serializes")))
        .bind(spec.http.as_ref().map(|h| serde_json::to_value(h).expect("an http block serializes")))
        .execute(&mut *tx)
        .await?;
        refs.push(action.action_ref.clone());
    }
    sqlx::query("DELETE FROM action WHERE pack = $1 AND NOT (ref = ANY($2))")
        .bind(pack_id)
        .bind(&refs)
        .execute(&mut *tx)
        .await?;
    let registered = sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE p.id = $1")))
        .bind(pack_id)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(registered)
}

pub async fn list(db: &PgPool) -> Result<Vec<Pack>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} ORDER BY p.ref"))).fetch_all(db).await
}
