//! The action table, as registered from packs.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgExecutor, PgPool};

#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Action {
    pub id: i64,
    #[serde(rename = "ref")]
    #[sqlx(rename = "ref")]
    pub action_ref: String,
    pub pack: i64,
    pub pack_ref: String,
    pub pack_path: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub runtime: String,
    pub entrypoint: String,
    /// Declared parameters: name → {type, required, default, enum, description}.
    #[schema(value_type = Object)]
    pub parameters: Value,
    pub timeout_seconds: Option<i32>,
    pub max_retries: Option<i32>,
    #[schema(value_type = Option<Object>)]
    pub retry_policy: Option<Value>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
}

const SELECT: &str = "SELECT a.id, a.ref, a.pack, p.ref AS pack_ref, p.path AS pack_path, a.name, \
    a.description, a.runtime, a.entrypoint, a.parameters, a.timeout_seconds, a.max_retries, \
    a.retry_policy, a.created, a.updated FROM action a JOIN pack p ON p.id = a.pack";

pub async fn get_by_ref(db: impl PgExecutor<'_>, action_ref: &str) -> Result<Option<Action>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE a.ref = $1"))).bind(action_ref).fetch_optional(db).await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Action>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE a.id = $1"))).bind(id).fetch_optional(db).await
}

pub async fn list(db: &PgPool, pack_ref: Option<&str>) -> Result<Vec<Action>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE ($1::text IS NULL OR p.ref = $1) ORDER BY a.ref")))
        .bind(pack_ref)
        .fetch_all(db)
        .await
}
