//! Pauses (`pause`): an action or a whole runtime an operator has paused. Its requests wait,
//! `requested`: the claim (`execution_claim`) skips them, and the wait for a worker does not fail
//! them (`execution::scheduler::waiting_longer_than`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// What is paused: one action, every action of a runtime, or one workflow run (its next steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PauseKind {
    Action,
    Runtime,
    /// A workflow run, by its execution's id: it starts no new step (what runs, runs on).
    Run,
}

impl PauseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseKind::Action => "action",
            PauseKind::Runtime => "runtime",
            PauseKind::Run => "run",
        }
    }

    pub fn parse(text: &str) -> Option<PauseKind> {
        match text {
            "action" => Some(PauseKind::Action),
            "runtime" => Some(PauseKind::Runtime),
            "run" => Some(PauseKind::Run),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Pause {
    /// `action`, `runtime` or `run`.
    pub kind: String,
    /// The action's ref, the runtime's name, or the workflow run's id.
    pub name: String,
    /// Why it was paused.
    pub reason: String,
    /// The API token that paused it.
    pub paused_by: Option<i64>,
    /// That token's name.
    pub paused_by_name: Option<String>,
    pub paused_at: DateTime<Utc>,
}

const COLUMNS: &str = "p.kind, p.name, p.reason, p.paused_by, t.name AS paused_by_name, p.paused_at";

/// Every pause, oldest first.
pub async fn list(db: &PgPool) -> Result<Vec<Pause>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM pause p LEFT JOIN api_token t ON t.id = p.paused_by ORDER BY p.paused_at, p.kind, p.name"
    )))
    .fetch_all(db)
    .await
}

/// Pauses `name` (a pause already there keeps when it began, and takes the new reason), and in
/// the same statement hands back to waiting (scheduled → requested: no retry spent) every
/// execution of it that is dispatched and not yet started: a worker that holds its dispatch
/// finds it no longer scheduled there when it would claim it, so nothing of it starts after the
/// pause answered. Returns the pause, whether it is new, and how many were handed back.
pub async fn pause(
    db: impl sqlx::PgExecutor<'_>,
    kind: PauseKind,
    name: &str,
    reason: &str,
    by: i64,
) -> Result<(Pause, bool, i64), sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Written {
        #[sqlx(flatten)]
        pause: Pause,
        new: bool,
        handed_back: i64,
    }
    let written: Written = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH p AS (INSERT INTO pause (kind, name, reason, paused_by) VALUES ($1, $2, $3, $4) \
            ON CONFLICT (kind, name) DO UPDATE SET reason = EXCLUDED.reason, paused_by = EXCLUDED.paused_by \
            RETURNING *, (xmax = 0) AS new), \
         back AS (UPDATE execution SET status = $5, worker = NULL, updated = now() \
            WHERE status = $6 AND CASE $1 WHEN 'action' THEN action_ref = $2 WHEN 'runtime' THEN runtime = $2 \
                ELSE false END \
            RETURNING id) \
         SELECT {COLUMNS}, p.new, (SELECT count(*) FROM back) AS handed_back \
         FROM p LEFT JOIN api_token t ON t.id = p.paused_by"
    )))
    .bind(kind.as_str())
    .bind(name)
    .bind(reason)
    .bind(by)
    .bind(attune_core::ExecutionStatus::Requested)
    .bind(attune_core::ExecutionStatus::Scheduled)
    .fetch_one(db)
    .await?;
    Ok((written.pause, written.new, written.handed_back))
}

pub async fn get(db: &PgPool, kind: PauseKind, name: &str) -> Result<Option<Pause>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM pause p LEFT JOIN api_token t ON t.id = p.paused_by WHERE p.kind = $1 AND p.name = $2"
    )))
    .bind(kind.as_str())
    .bind(name)
    .fetch_optional(db)
    .await
}

/// Resumes `name`: its requests are claimed again from the executors' next look (within a
/// second). Returns the pause it ended, if there was one.
pub async fn resume(db: impl sqlx::PgExecutor<'_>, kind: PauseKind, name: &str) -> Result<Option<Pause>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH p AS (DELETE FROM pause WHERE kind = $1 AND name = $2 RETURNING *) \
         SELECT {COLUMNS} FROM p LEFT JOIN api_token t ON t.id = p.paused_by"
    )))
    .bind(kind.as_str())
    .bind(name)
    .fetch_optional(db)
    .await
}
