//! The secret store's table (`attune_common::secrets` seals and opens the values).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// A secret as it is listed: never its value.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SecretInfo {
    pub name: String,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
    /// The token that set it last.
    pub updated_by: Option<i64>,
    /// The actions that may be given it: action refs (`pack.name`), packs (`pack`) or `*` (any).
    pub users: Vec<String>,
}

const INFO: &str = "name, created, updated, updated_by, users";

/// Sets secret `name` to `sealed` (made or replaced), for `users`; returns it as listed.
pub async fn set(
    db: impl sqlx::PgExecutor<'_>,
    name: &str,
    sealed: &[u8],
    users: &[String],
    by: i64,
) -> Result<SecretInfo, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO secret (name, sealed, updated_by, users) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (name) DO UPDATE SET sealed = EXCLUDED.sealed, updated = now(), \
             updated_by = EXCLUDED.updated_by, users = EXCLUDED.users \
         RETURNING {INFO}"
    )))
    .bind(name)
    .bind(sealed)
    .bind(by)
    .bind(users)
    .fetch_one(db)
    .await
}

/// Of the secrets `names`, those that are set but not for the action `action_ref`, with their
/// users (`secret_for`, which `run_secrets` holds the workers to as well).
pub async fn not_for(
    db: &PgPool,
    action_ref: &str,
    names: &[String],
) -> Result<Vec<(String, Vec<String>)>, sqlx::Error> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as("SELECT name, users FROM secret WHERE name = ANY($2) AND NOT secret_for(users, $1) ORDER BY name")
        .bind(action_ref)
        .bind(names)
        .fetch_all(db)
        .await
}

/// Of the secrets `names`, those that are not stored, in order.
pub async fn missing(db: &PgPool, names: &[String]) -> Result<Vec<String>, sqlx::Error> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(
        "SELECT n FROM unnest($1::text[]) AS n WHERE NOT EXISTS (SELECT 1 FROM secret s WHERE s.name = n) ORDER BY n",
    )
    .bind(names)
    .fetch_all(db)
    .await
}

/// Every secret, by name.
pub async fn list(db: &PgPool) -> Result<Vec<SecretInfo>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {INFO} FROM secret ORDER BY name"))).fetch_all(db).await
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

/// Every stored secret's name and sealed value, by name (for `attune secret reseal`, as the
/// schema's owner).
pub async fn all_sealed(db: &PgPool) -> Result<Vec<(String, Vec<u8>)>, sqlx::Error> {
    sqlx::query_as("SELECT name, sealed FROM secret ORDER BY name").fetch_all(db).await
}

/// Replaces secret `name`'s sealed value `was` with `now`, unless it changed meanwhile (a secret
/// set again is sealed with the key in force already); whether it was replaced.
pub async fn reseal(db: &PgPool, name: &str, was: &[u8], now: &[u8]) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("UPDATE secret SET sealed = $3 WHERE name = $1 AND sealed = $2")
        .bind(name)
        .bind(was)
        .bind(now)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Up to `limit` executions after id `after` whose parameters hold a sealed value
/// (`{"$sealed": …}`), by id: their id, action and parameters.
pub async fn executions_with_sealed(
    db: &PgPool,
    after: i64,
    limit: i64,
) -> Result<Vec<(i64, String, serde_json::Value)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, action_ref, parameters FROM execution \
         WHERE id > $1 AND jsonb_typeof(parameters) = 'object' AND parameters @? '$.*.\"$sealed\"' \
         ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// What holds sealed parameters: an execution, or a schedule (which gives them to each run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Execution(i64),
    Schedule(i64),
}

/// Replaces `holder`'s parameters `was` with `now`, unless they changed meanwhile.
pub async fn reseal_parameters(
    db: &PgPool,
    holder: Holder,
    was: &serde_json::Value,
    now: &serde_json::Value,
) -> Result<bool, sqlx::Error> {
    let (sql, id) = match holder {
        Holder::Execution(id) => ("UPDATE execution SET parameters = $3 WHERE id = $1 AND parameters = $2", id),
        Holder::Schedule(id) => ("UPDATE schedule SET parameters = $3 WHERE id = $1 AND parameters = $2", id),
    };
    let done = sqlx::query(sql).bind(id).bind(was).bind(now).execute(db).await?;
    Ok(done.rows_affected() == 1)
}

/// Every schedule whose parameters hold a sealed value: its id, action and parameters (what
/// each of its runs is given, `schedule_fire`).
pub async fn schedules_with_sealed(db: &PgPool) -> Result<Vec<(i64, String, serde_json::Value)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, action_ref, parameters FROM schedule \
         WHERE jsonb_typeof(parameters) = 'object' AND parameters @? '$.*.\"$sealed\"' ORDER BY id",
    )
    .fetch_all(db)
    .await
}
