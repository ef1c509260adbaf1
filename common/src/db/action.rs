//! The action table, as registered from packs.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgExecutor, PgPool};

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
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
    /// The request of an `http` action; the value of a header that carries credentials
    /// (`attune_core::pack::is_sensitive_header`) is shown `[redacted]`.
    #[schema(value_type = Option<Object>)]
    #[serde(serialize_with = "shown_http")]
    pub http: Option<Value>,
    /// The action's `limits:` block as written (`memory_mb`, `cpu_secs`, `open_files`,
    /// `output_kb`); what is unset takes the worker's defaults, and the worker caps each at its
    /// maximum.
    #[schema(value_type = Option<Object>)]
    pub limits: Option<Value>,
    /// The action's circuit breaker (its `retry.circuit`, else the global one), once evaluated:
    /// `state` is `closed`, `open` (nothing of the action is dispatched until `open_until`) or
    /// `half_open` (one trial runs); null while it never was.
    #[schema(value_type = Option<crate::db::circuit::CircuitView>)]
    pub circuit: Option<Value>,
    /// The concurrency policy in force (`{limit, key}`: at most `limit` scheduled or running at
    /// once, per value of the parameter `key` if set); null: no limit. An operator's policy
    /// (`concurrency_set`) stands in for the pack's (`concurrency_declared`).
    #[schema(value_type = Option<attune_core::pack::ConcurrencySpec>)]
    pub concurrency: Option<Value>,
    /// The action's `concurrency:` block as its pack declares it.
    #[schema(value_type = Option<attune_core::pack::ConcurrencySpec>)]
    pub concurrency_declared: Option<Value>,
    /// An operator's policy, set through the API in place of the pack's (`limit` null: no limit),
    /// with who set it (`set_by`, a token id), when and why; a pack registration keeps it.
    #[schema(value_type = Option<ConcurrencySet>)]
    pub concurrency_set: Option<Value>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
}

/// Serializes an action's `http` block with its credential headers' values `[redacted]`.
fn shown_http<S: serde::Serializer>(http: &Option<Value>, serializer: S) -> Result<S::Ok, S::Error> {
    let mut shown = http.clone();
    if let Some(headers) = shown.as_mut().and_then(|http| http.get_mut("headers")).and_then(Value::as_object_mut) {
        for (name, value) in headers.iter_mut() {
            if attune_core::pack::is_sensitive_header(name) {
                *value = Value::String(crate::secrets::REDACTED.into());
            }
        }
    }
    serde::Serialize::serialize(&shown, serializer)
}

const SELECT: &str = "SELECT a.id, a.ref, a.pack, p.ref AS pack_ref, p.path AS pack_path, a.name, \
    a.description, a.runtime, a.entrypoint, a.parameters, a.timeout_seconds, a.max_retries, \
    a.retry_policy, a.http, a.limits, \
    (SELECT to_jsonb(c) - 'action' FROM action_circuit c WHERE c.action = a.id) AS circuit, \
    concurrency_in_force(a.concurrency, a.concurrency_set) AS concurrency, a.concurrency AS concurrency_declared, \
    a.concurrency_set, a.created, a.updated FROM action a JOIN pack p ON p.id = a.pack";

/// An operator's concurrency policy, as stored in `action.concurrency_set`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, utoipa::ToSchema)]
pub struct ConcurrencySet {
    /// null: no limit, whatever the pack declares.
    pub limit: Option<i64>,
    pub key: Option<String>,
    /// The API token that set it.
    pub set_by: i64,
    pub set_at: DateTime<Utc>,
    pub reason: String,
}

/// Sets (`Some`) or clears (`None`: the pack's policy again) the operator's concurrency policy of
/// the action `action_ref`; the action as it is now, `None` if there is no such action. The
/// executors' next claims follow it. On a pool it commits; in a transaction it is a savepoint of it.
pub async fn set_concurrency(
    db: impl sqlx::Acquire<'_, Database = sqlx::Postgres>,
    action_ref: &str,
    set: Option<&ConcurrencySet>,
) -> Result<Option<Action>, sqlx::Error> {
    let set = set.map(|set| serde_json::to_value(set).expect("a concurrency policy serializes"));
    let mut tx = db.begin().await?;
    let updated: Option<i64> =
        sqlx::query_scalar("UPDATE action SET concurrency_set = $2, updated = now() WHERE ref = $1 RETURNING id")
            .bind(action_ref)
            .bind(set)
            .fetch_optional(&mut *tx)
            .await?;
    let action = match updated {
        Some(id) => get(&mut *tx, id).await?,
        None => None,
    };
    tx.commit().await?;
    Ok(action)
}

pub async fn get_by_ref(db: impl PgExecutor<'_>, action_ref: &str) -> Result<Option<Action>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE a.ref = $1"))).bind(action_ref).fetch_optional(db).await
}

/// The declared parameters of the action `action_ref` (what an opened secret is held to).
pub async fn declared_parameters(
    db: impl PgExecutor<'_>,
    action_ref: &str,
) -> Result<Option<serde_json::Value>, sqlx::Error> {
    sqlx::query_scalar("SELECT parameters FROM action WHERE ref = $1").bind(action_ref).fetch_optional(db).await
}

/// The action's stored `retry:` block, if it has one.
pub async fn retry_policy(db: impl PgExecutor<'_>, id: i64) -> Result<Option<serde_json::Value>, sqlx::Error> {
    sqlx::query_scalar("SELECT retry_policy FROM action WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await
        .map(Option::flatten)
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

/// Actions read recently, by id and by ref, each reused for `ttl` (0: always read): the API's
/// submissions and the scheduler's decisions then cost no action read under steady traffic. A pack
/// update reaches them within `ttl`.
pub struct ActionCache {
    ttl: std::time::Duration,
    entries: std::sync::Mutex<CacheEntries>,
}

#[derive(Default)]
struct CacheEntries {
    by_id: std::collections::HashMap<i64, (std::time::Instant, std::sync::Arc<Action>)>,
    by_ref: std::collections::HashMap<String, (std::time::Instant, std::sync::Arc<Action>)>,
}

/// Entries kept at most (beyond it the cache starts over; real deployments have far fewer actions).
const CACHE_CAPACITY: usize = 10_000;

impl ActionCache {
    pub fn new(ttl: std::time::Duration) -> Self {
        ActionCache { ttl, entries: Default::default() }
    }

    pub async fn get(&self, db: &PgPool, id: i64) -> Result<Option<std::sync::Arc<Action>>, sqlx::Error> {
        if let Some(action) = self.fresh(|entries| entries.by_id.get(&id)) {
            return Ok(Some(action));
        }
        Ok(get(db, id).await?.map(|action| self.remember(action)))
    }

    pub async fn get_by_ref(
        &self,
        db: &PgPool,
        action_ref: &str,
    ) -> Result<Option<std::sync::Arc<Action>>, sqlx::Error> {
        if let Some(action) = self.fresh(|entries| entries.by_ref.get(action_ref)) {
            return Ok(Some(action));
        }
        Ok(get_by_ref(db, action_ref).await?.map(|action| self.remember(action)))
    }

    /// Forgets every action (after a pack registration, which may have changed any of them).
    pub fn clear(&self) {
        *self.entries.lock().expect("action cache poisoned") = CacheEntries::default();
    }

    fn fresh(
        &self,
        find: impl FnOnce(&CacheEntries) -> Option<&(std::time::Instant, std::sync::Arc<Action>)>,
    ) -> Option<std::sync::Arc<Action>> {
        let entries = self.entries.lock().expect("action cache poisoned");
        find(&entries).filter(|(read_at, _)| read_at.elapsed() < self.ttl).map(|(_, action)| action.clone())
    }

    fn remember(&self, action: Action) -> std::sync::Arc<Action> {
        let action = std::sync::Arc::new(action);
        if self.ttl.is_zero() {
            return action;
        }
        let now = std::time::Instant::now();
        let mut entries = self.entries.lock().expect("action cache poisoned");
        if entries.by_id.len() >= CACHE_CAPACITY {
            *entries = CacheEntries::default();
        }
        entries.by_id.insert(action.id, (now, action.clone()));
        entries.by_ref.insert(action.action_ref.clone(), (now, action.clone()));
        action
    }
}
