//! The pack table, and registering a loaded pack with its actions in one transaction.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Acquire, PgPool, Postgres};

use crate::pack::LoadedPack;

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

const SELECT: &str = "SELECT p.id, p.ref, p.version, p.description, p.path, \
    (SELECT count(*) FROM action a WHERE a.pack = p.id) AS action_count, p.created, p.updated FROM pack p";

/// Why a pack was not registered.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The ref belongs to a pack registered from another directory: taking it over replaces the
    /// code every execution of its actions runs, so it needs an explicit force.
    #[error(
        "pack '{pack_ref}' is already registered from {existing}; registering it from another directory needs force"
    )]
    Taken { pack_ref: String, existing: String },
    /// A workflow's step names an action that is neither in the pack nor registered, or is a
    /// workflow itself (a step is one action).
    #[error(transparent)]
    Invalid(#[from] crate::pack::PackError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Creates or updates the pack and its actions; actions no longer in the pack are removed
/// (executions keep their `action_ref`). A pack already registered under the same ref from
/// another directory is refused (`RegisterError::Taken`); `register_replacing` takes it over.
/// On a pool it commits; in a transaction (the API's, with its audit row) it is a savepoint of it.
pub async fn register(db: impl Acquire<'_, Database = Postgres>, pack: &LoadedPack) -> Result<Pack, RegisterError> {
    register_with(db, pack, false).await
}

/// `register`, taking the ref over from another directory if it is registered from one (an
/// admin's explicit force).
pub async fn register_replacing(
    db: impl Acquire<'_, Database = Postgres>,
    pack: &LoadedPack,
) -> Result<Pack, RegisterError> {
    register_with(db, pack, true).await
}

async fn register_with(
    db: impl Acquire<'_, Database = Postgres>,
    pack: &LoadedPack,
    replace: bool,
) -> Result<Pack, RegisterError> {
    let mut tx = db.begin().await?;
    let path = std::fs::canonicalize(&pack.path).unwrap_or_else(|_| pack.path.clone());
    let existing: Option<Option<String>> = sqlx::query_scalar("SELECT path FROM pack WHERE ref = $1 FOR UPDATE")
        .bind(&pack.manifest.pack_ref)
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(Some(existing)) = existing
        && !replace
        && std::path::Path::new(&existing) != path
    {
        return Err(RegisterError::Taken { pack_ref: pack.manifest.pack_ref.clone(), existing });
    }
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
                timeout_seconds, max_retries, retry_policy, http, limits, retention, concurrency) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (ref) DO UPDATE SET pack = $2, name = $3, description = $4, runtime = $5, \
                entrypoint = $6, parameters = $7, timeout_seconds = $8, max_retries = $9, \
                retry_policy = $10, http = $11, limits = $12, retention = $13, concurrency = $14, \
                updated = now()",
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
        .bind(spec.limits.as_ref().map(|l| serde_json::to_value(l).expect("a limits block serializes")))
        .bind(retention_secs(spec))
        .bind(spec.concurrency.as_ref().map(|c| serde_json::to_value(c).expect("a concurrency block serializes")))
        .execute(&mut *tx)
        .await?;
        refs.push(action.action_ref.clone());
    }
    for workflow in &pack.workflows {
        register_workflow(&mut tx, pack_id, workflow).await?;
        refs.push(workflow.workflow_ref.clone());
    }
    // once every action and workflow of the pack is in: a step naming one of them sees what it
    // is now
    for workflow in &pack.workflows {
        check_steps(&mut tx, workflow).await?;
    }
    sqlx::query("DELETE FROM action WHERE pack = $1 AND NOT (ref = ANY($2))")
        .bind(pack_id)
        .bind(&refs)
        .execute(&mut *tx)
        .await?;
    crate::db::events::register(&mut tx, pack).await?;
    let registered = sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE p.id = $1")))
        .bind(pack_id)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(registered)
}

/// Every step's action exists and is not a workflow (a step runs one action).
async fn check_steps(tx: &mut sqlx::PgConnection, workflow: &crate::pack::LoadedWorkflow) -> Result<(), RegisterError> {
    let spec = &workflow.spec;
    for (phase, list) in [("steps", &spec.steps), ("on-failure", &spec.on_failure)] {
        for step in list {
            let runtime: Option<String> = sqlx::query_scalar("SELECT runtime FROM action WHERE ref = $1")
                .bind(&step.action)
                .fetch_optional(&mut *tx)
                .await?;
            let field = format!("{phase}.{}.action", step.name);
            let problem = match runtime.as_deref() {
                None => format!("no action '{}' is registered, nor is it in this pack", step.action),
                Some(attune_core::workflow::RUNTIME) => {
                    format!("'{}' is a workflow: a step runs one action", step.action)
                }
                Some(_) => continue,
            };
            return Err(crate::pack::PackError::new(&workflow.file, Some(&field), problem).into());
        }
    }
    Ok(())
}

/// The workflow as an action of runtime `workflow` (its input as the action's parameters, its
/// run's timeout), and its definition kept under its hash, which the action names: runs pin the
/// hash they start with.
async fn register_workflow(
    tx: &mut sqlx::PgConnection,
    pack_id: i64,
    workflow: &crate::pack::LoadedWorkflow,
) -> Result<(), RegisterError> {
    use sha2::{Digest, Sha256};
    let spec = &workflow.spec;
    let definition = attune_core::workflow::canonical(spec);
    let hash: String = Sha256::digest(definition.to_string().as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    sqlx::query(
        "INSERT INTO workflow_definition (hash, ref, definition) VALUES ($1, $2, $3) ON CONFLICT (hash) DO NOTHING",
    )
    .bind(&hash)
    .bind(&workflow.workflow_ref)
    .bind(&definition)
    .execute(&mut *tx)
    .await?;
    let entrypoint =
        format!("workflows/{}", workflow.file.file_name().map(|f| f.to_string_lossy()).unwrap_or_default());
    sqlx::query(
        "INSERT INTO action (ref, pack, name, description, runtime, entrypoint, parameters, timeout_seconds, \
            max_retries, workflow) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, $9) \
         ON CONFLICT (ref) DO UPDATE SET pack = $2, name = $3, description = $4, runtime = $5, entrypoint = $6, \
            parameters = $7, timeout_seconds = $8, max_retries = 0, retry_policy = NULL, http = NULL, limits = NULL, \
            retention = NULL, concurrency = NULL, workflow = $9, updated = now()",
    )
    .bind(&workflow.workflow_ref)
    .bind(pack_id)
    .bind(&spec.name)
    .bind(&spec.description)
    .bind(attune_core::workflow::RUNTIME)
    .bind(entrypoint)
    .bind(serde_json::to_value(&spec.input).expect("parameters serialize"))
    .bind(spec.timeout_seconds())
    .bind(&hash)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

pub async fn list(db: &PgPool) -> Result<Vec<Pack>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{SELECT} ORDER BY p.ref"))).fetch_all(db).await
}

/// An action's `retention` block as stored: seconds per finished status, null for `off`
/// (validated when the pack was loaded; an age that does not parse is left out).
fn retention_secs(spec: &attune_core::pack::ActionSpec) -> Option<serde_json::Value> {
    spec.retention.as_ref()?;
    let ages = spec.retention_ages().unwrap_or_default();
    let map: serde_json::Map<String, serde_json::Value> =
        ages.into_iter().map(|(status, age)| (status.as_str().to_string(), age.secs().into())).collect();
    Some(serde_json::Value::Object(map))
}
