//! Workflow runs in the record (migration `20261206000000_workflows.sql`, ADR 0012): the pinned
//! definitions, the runs' rows, the latest attempt of each step item, and the one way steps are
//! made (`workflow_step_start`).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgExecutor, PgPool};

use attune_core::ExecutionStatus;
use attune_core::workflow::Attempt;

/// A run's row: the definition it pinned and the run it resumes, if it is a retry.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Run {
    pub execution: i64,
    pub definition: String,
    pub resumes: Option<i64>,
    /// When an executor last advanced it.
    pub advanced: Option<DateTime<Utc>>,
}

/// An advance's transaction. Its commit does not wait for the WAL to reach the disk
/// (`synchronous_commit = off`): what it makes is acted on only through a later commit that does
/// wait and that flushes the WAL up to itself, so this one's too. A step it starts is dispatched
/// only once the scheduler's claim of it has committed, synchronously (`execution::scheduler::claim_waiting`):
/// no dispatch names a step, nor an id, that a crash could take back. The run it starts is seen
/// by its steps' claims; it raises no event (nothing in it ends). An advance lost with a crash of
/// PostgreSQL before its WAL was written is made again from the record by the next (the workflow
/// engine's sweep), as one cut off before its commit. The wait it saves is one of the four
/// flushes on a step's critical path.
pub async fn begin_advance(db: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    db.begin_with("BEGIN; SET LOCAL synchronous_commit = off").await
}

/// Run `id`'s row, locked until the transaction ends: one advance of a run at a time, whatever
/// the executors. With it, whether the run starts no new step (`paused`, read in the same
/// statement: one round trip fewer on every advance). The run's execution is read after it (a
/// statement of its own sees what committed while the lock was waited for: a cancel).
pub async fn lock(db: impl PgExecutor<'_>, id: i64) -> Result<Option<(Run, bool)>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Locked {
        #[sqlx(flatten)]
        run: Run,
        paused: bool,
    }
    let locked: Option<Locked> = sqlx::query_as(
        "UPDATE workflow_run r SET advanced = now() FROM execution e WHERE r.execution = $1 AND e.id = r.execution \
         RETURNING r.execution, r.definition, r.resumes, r.advanced, \
            EXISTS (SELECT 1 FROM pause p WHERE (p.kind = 'runtime' AND p.name = 'workflow') \
                    OR (p.kind = 'action' AND p.name = e.action_ref) OR (p.kind = 'run' AND p.name = $1::text)) AS paused",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(locked.map(|locked| (locked.run, locked.paused)))
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Run>, sqlx::Error> {
    sqlx::query_as("SELECT execution, definition, resumes, advanced FROM workflow_run WHERE execution = $1")
        .bind(id)
        .fetch_optional(db)
        .await
}

/// The definition registered under `hash`.
pub async fn definition(db: impl PgExecutor<'_>, hash: &str) -> Result<Option<Value>, sqlx::Error> {
    sqlx::query_scalar("SELECT definition FROM workflow_definition WHERE hash = $1").bind(hash).fetch_optional(db).await
}

/// The runs `id` resumes, nearest first (a retry of a retry resumes both).
pub async fn resumed(db: impl PgExecutor<'_>, id: i64) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH RECURSIVE up(execution, resumes, depth) AS ( \
            SELECT execution, resumes, 0 FROM workflow_run WHERE execution = $1 \
            UNION ALL SELECT r.execution, r.resumes, up.depth + 1 FROM workflow_run r JOIN up ON r.execution = up.resumes \
            WHERE up.depth < 100) \
         SELECT execution FROM up WHERE depth > 0 ORDER BY depth",
    )
    .bind(id)
    .fetch_all(db)
    .await
}

#[derive(Debug, Clone, sqlx::FromRow)]
struct AttemptRow {
    workflow_run: i64,
    workflow_step: String,
    workflow_item: i32,
    id: i64,
    status: ExecutionStatus,
    result: Option<Value>,
    error: Option<String>,
    exit_code: Option<i32>,
    attempts: i64,
}

/// One (step, item) of a run: its latest attempt.
pub type Attempts = std::collections::BTreeMap<(String, i32), Attempt>;

/// The latest attempt of each step item of run `id`; where `id` resumes earlier runs, the items
/// of `main_steps` they completed that `id` has not run stand as done (the nearest run's first).
pub async fn attempts(
    db: &mut sqlx::PgConnection,
    id: i64,
    resumed: &[i64],
    main_steps: &[&str],
) -> Result<Attempts, sqlx::Error> {
    let mut runs = vec![id];
    runs.extend_from_slice(resumed);
    let rows: Vec<AttemptRow> = sqlx::query_as(
        "SELECT DISTINCT ON (workflow_run, workflow_step, workflow_item) workflow_run, workflow_step, workflow_item, \
            id, status, result, error, exit_code, \
            count(*) OVER (PARTITION BY workflow_run, workflow_step, workflow_item) AS attempts \
         FROM execution WHERE workflow_run = ANY($1) \
         ORDER BY workflow_run, workflow_step, workflow_item, id DESC",
    )
    .bind(&runs)
    .fetch_all(&mut *db)
    .await?;
    let mut out = Attempts::new();
    for run in &runs {
        for row in rows.iter().filter(|r| r.workflow_run == *run) {
            let key = (row.workflow_step.clone(), row.workflow_item);
            // (a run resumed lends only main steps: its on-failure steps ran for its own failure)
            let lent = row.status == ExecutionStatus::Completed && main_steps.contains(&row.workflow_step.as_str());
            if out.contains_key(&key) || (*run != id && !lent) {
                continue;
            }
            out.insert(
                key,
                Attempt {
                    execution: row.id,
                    status: row.status,
                    result: row.result.clone(),
                    error: row.error.clone(),
                    exit_code: row.exit_code,
                    attempts: i32::try_from(row.attempts).unwrap_or(i32::MAX),
                },
            );
        }
    }
    Ok(out)
}

/// The latest attempt of each step item among `executions` (those of one run, in step, item and
/// id order, as `step_executions` reads them).
pub fn latest_attempts(executions: &[StepExecution]) -> Attempts {
    let mut out = Attempts::new();
    for execution in executions {
        let key = (execution.step.clone(), execution.item);
        let attempts = out.get(&key).map_or(0, |a: &Attempt| a.attempts) + 1;
        out.insert(
            key,
            Attempt {
                execution: execution.id,
                status: execution.status,
                result: execution.result.clone(),
                error: execution.error.clone(),
                exit_code: execution.exit_code,
                attempts,
            },
        );
    }
    out
}

/// Item `item` of step `step` of run `run` (`workflow_step_start`): its id, `None` if it was
/// started already. `failure`: recorded failed with that reason (`invalid_parameters`), never run.
pub async fn start_step(
    db: impl PgExecutor<'_>,
    run: i64,
    step: &str,
    item: i32,
    parameters: &Value,
    failure: Option<&str>,
    default_timeout_secs: i32,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT workflow_step_start($1, $2, $3, $4, $5, $6)")
        .bind(run)
        .bind(step)
        .bind(item)
        .bind(parameters)
        .bind(failure)
        .bind(default_timeout_secs)
        .fetch_one(db)
        .await
}

/// Workflow runs waiting to start (`requested`), not paused (by their workflow's ref or the
/// `workflow` runtime), oldest first.
pub async fn waiting(db: &PgPool, limit: i64) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM execution e WHERE status = $2 AND runtime = 'workflow' \
         AND COALESCE(not_before, created) <= now() \
         AND NOT EXISTS (SELECT 1 FROM pause p WHERE (p.kind = 'runtime' AND p.name = 'workflow') \
                         OR (p.kind = 'action' AND p.name = e.action_ref) OR (p.kind = 'run' AND p.name = e.id::text)) \
         ORDER BY COALESCE(not_before, created), id LIMIT $1",
    )
    .bind(limit)
    .bind(ExecutionStatus::Requested)
    .fetch_all(db)
    .await
}

/// Runs to advance at a sweep: those running, the least recently advanced first (so that every
/// run is reached however many there are), and those ended with a step still unfinished (a
/// cancel whose steps were not all stopped yet).
pub async fn to_sweep(db: &PgPool, limit: i64) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "(SELECT r.execution FROM workflow_run r JOIN execution e ON e.id = r.execution \
          WHERE e.status = $2 ORDER BY r.advanced NULLS FIRST LIMIT $1) \
         UNION \
         (SELECT DISTINCT s.workflow_run FROM execution s JOIN execution r ON r.id = s.workflow_run \
          WHERE s.workflow_run IS NOT NULL AND NOT s.status = ANY($3) AND r.status = ANY($3) LIMIT $1)",
    )
    .bind(limit)
    .bind(ExecutionStatus::Running)
    .bind(&ExecutionStatus::TERMINAL[..])
    .fetch_all(db)
    .await
}

/// The steps of run `id` not finished: their ids and workers.
pub async fn unfinished_steps(db: impl PgExecutor<'_>, id: i64) -> Result<Vec<(i64, Option<i64>)>, sqlx::Error> {
    sqlx::query_as("SELECT id, worker FROM execution WHERE workflow_run = $1 AND NOT status = ANY($2) ORDER BY id")
        .bind(id)
        .bind(&ExecutionStatus::TERMINAL[..])
        .fetch_all(db)
        .await
}

/// One execution of a run's step, as the run's graph shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StepExecution {
    pub id: i64,
    pub step: String,
    pub item: i32,
    pub action_ref: String,
    pub status: ExecutionStatus,
    pub retry_count: i32,
    pub original_execution: Option<i64>,
    pub failure_kind: Option<String>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub worker: Option<i64>,
    pub created: DateTime<Utc>,
    pub started: Option<DateTime<Utc>>,
    pub finished: Option<DateTime<Utc>>,
}

/// Every execution of run `id`'s steps, each attempt, in step and item order.
pub async fn step_executions(db: impl PgExecutor<'_>, id: i64) -> Result<Vec<StepExecution>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, workflow_step AS step, workflow_item AS item, action_ref, status, retry_count, original_execution, \
            failure_kind, error, exit_code, result, worker, created, started, finished \
         FROM execution WHERE workflow_run = $1 ORDER BY workflow_step, workflow_item, id",
    )
    .bind(id)
    .fetch_all(db)
    .await
}
