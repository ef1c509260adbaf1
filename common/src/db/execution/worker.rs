//! A worker's writes and reads: its claims (scheduled → running, fenced by the worker and a
//! run token, reading what to run in the same statement) and successes, batched and sure of
//! their answer; hand-backs of what it will not start; what it holds and runs.

use serde_json::Value;
use sqlx::{PgExecutor, PgPool};

use attune_core::status::ExecutionStatus;

use super::{Changed, Outcome, Patience, Transition, TransitionRow, count_finished, patiently};

/// Keeps what a run printed before it was stopped by hand (a cancel, an operator's fail) in its
/// ended row: the worker `worker` that ran it, by the run's token, once
/// (`execution_stopped_output`). `false` when the row is not such a run.
pub async fn keep_stopped_output(
    db: impl PgExecutor<'_>,
    id: i64,
    worker: i64,
    run_token: Option<&str>,
    stdout: &str,
    stderr: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT execution_stopped_output($1, $2, $3, $4, $5)")
        .bind(id)
        .bind(worker)
        .bind(run_token)
        .bind(stdout)
        .bind(stderr)
        .fetch_one(db)
        .await
}

/// A worker's claim: the run as the database names it, read in the claim's own statement. The
/// dispatch message names only the execution and the worker, and nothing else in it is believed.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ClaimedRun {
    pub id: i64,
    pub status: ExecutionStatus,
    pub action_ref: String,
    pub worker: Option<i64>,
    pub parameters: Value,
    pub timeout_seconds: Option<i32>,
    pub retry_count: i32,
    pub idempotency_key: String,
    /// The token the claim stored (see `claim`).
    pub run_token: Option<String>,
    /// See `Execution::trace_parent`.
    pub trace_parent: Option<String>,
    /// The action's runtime (`None`, like the four below, when the action is gone).
    pub runtime: Option<String>,
    pub entrypoint: Option<String>,
    /// The directory of the action's pack.
    pub pack_path: Option<String>,
    /// The action's `http` block.
    pub http: Option<Value>,
    /// The action's `retry` block (its `exit_codes` are transient).
    pub retry_policy: Option<Value>,
    /// The action's `limits` block, as written (the worker fills in and caps what it enforces).
    pub limits: Option<Value>,
    /// The claim counted it against a concurrency policy: ended by hand, it keeps its slot until
    /// its worker says its processes are gone (`release`).
    pub concurrency_limited: bool,
}

/// What a claim reads, from the claimed row `c`, its action `a` and the action's pack `p`.
const RUN_COLUMNS: &str = "c.id, c.status, c.action_ref, c.worker, c.parameters, c.timeout_seconds, c.retry_count, \
    c.idempotency_key, c.run_token, c.trace_parent, a.runtime, a.entrypoint, p.path AS pack_path, a.http, a.retry_policy, \
    a.limits, c.concurrency_limited FROM c LEFT JOIN action a ON a.id = c.action LEFT JOIN pack p ON p.id = a.pack";

/// scheduled → running on `worker_id` for each `(execution, run token)` still dispatched there
/// (`Transition::claim`; the token drawn by the worker, see `ExecutionResult::run_token`), in one
/// statement, with what to run, read from each execution, its action and the action's pack.
/// Returns the runs it claimed (the others were stale, duplicate or forged: canceled, handed back,
/// taken elsewhere, never scheduled here), in no set order; nothing else is written. With
/// `Patience::Surely`, a run that an attempt cut off by an outage claimed with its very token is
/// read back as claimed (its acknowledgement was lost).
pub async fn claim(
    db: &PgPool,
    worker_id: i64,
    claims: &[(i64, &str)],
    patience: Patience,
) -> Result<Vec<ClaimedRun>, sqlx::Error> {
    let ids: Vec<i64> = claims.iter().map(|(id, _)| *id).collect();
    let tokens: Vec<&str> = claims.iter().map(|(_, token)| *token).collect();
    let first = ids.first().copied().unwrap_or_default();
    patiently(db, "claiming executions", first, patience, |mut connection, doubt| {
        let (ids, tokens) = (&ids, &tokens);
        async move {
            let answer = claim_runs(&mut *connection, ids, tokens, worker_id, doubt).await;
            (connection, answer)
        }
    })
    .await
}

/// Every worker claim: the SQL function `claim_runs` (one guarded primary-key UPDATE per
/// execution) and what to run, in one statement. With `landed_too` (after an outage) a run
/// already claimed here with its token is read back as claimed.
async fn claim_runs(
    db: impl PgExecutor<'_>,
    ids: &[i64],
    tokens: &[&str],
    worker_id: i64,
    landed_too: bool,
) -> Result<Vec<ClaimedRun>, sqlx::Error> {
    // (what `claim_runs` does, checked against the state machine)
    Transition::claim(worker_id).check();
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH c AS (SELECT * FROM claim_runs($1, $2, $3, $4)) SELECT {RUN_COLUMNS}"
    )))
    .bind(ids)
    .bind(tokens)
    .bind(worker_id)
    .bind(landed_too)
    .fetch_all(db)
    .await
}

/// The outcomes of a batch of successes, each without the NUL characters PostgreSQL's text refuses.
fn without_nuls<'a>(done: &[(i64, &'a Outcome, Option<&str>)]) -> Vec<std::borrow::Cow<'a, Outcome>> {
    done.iter()
        .map(|(_, outcome, _)| match outcome.has_nul() {
            true => std::borrow::Cow::Owned(outcome.without_nul()),
            false => std::borrow::Cow::Borrowed(*outcome),
        })
        .collect()
}

/// A batch of successes as the first eight arguments of `complete_runs`, one array per column.
struct SuccessColumns<'a> {
    ids: Vec<i64>,
    tokens: Vec<Option<&'a str>>,
    results: Vec<Option<Value>>,
    errors: Vec<Option<&'a str>>,
    exit_codes: Vec<Option<i32>>,
    stdouts: Vec<Option<&'a str>>,
    stderrs: Vec<Option<&'a str>>,
    http_statuses: Vec<Option<i32>>,
}

impl<'a> SuccessColumns<'a> {
    fn of(done: &[(i64, &Outcome, Option<&'a str>)], outcomes: &'a [std::borrow::Cow<'_, Outcome>]) -> Self {
        SuccessColumns {
            ids: done.iter().map(|(id, _, _)| *id).collect(),
            tokens: done.iter().map(|(_, _, token)| *token).collect(),
            results: outcomes.iter().map(|o| o.result.clone()).collect(),
            errors: outcomes.iter().map(|o| o.error.as_deref()).collect(),
            exit_codes: outcomes.iter().map(|o| o.exit_code).collect(),
            stdouts: outcomes.iter().map(|o| o.stdout.as_deref()).collect(),
            stderrs: outcomes.iter().map(|o| o.stderr.as_deref()).collect(),
            http_statuses: outcomes.iter().map(|o| o.http_status).collect(),
        }
    }

    /// `query` with these bound as its first eight parameters.
    fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.tokens)
            .bind(&self.results)
            .bind(&self.errors)
            .bind(&self.exit_codes)
            .bind(&self.stdouts)
            .bind(&self.stderrs)
            .bind(&self.http_statuses)
    }
}

/// A worker's record of its successes (`Transition::completion` fenced by each run's token):
/// running → completed on `worker_id` for each `(execution, outcome, run token)`, in one
/// statement. Returns the rows it changed (the others no longer ran here: canceled or taken
/// over). With `Patience::Surely`, a row that an attempt cut off by an outage completed here
/// with that token counts as recorded.
pub async fn complete(
    db: &PgPool,
    worker_id: i64,
    done: &[(i64, &Outcome, Option<&str>)],
    patience: Patience,
) -> Result<Vec<Changed>, sqlx::Error> {
    // (what `complete_runs` does, checked against the state machine)
    Transition::to(ExecutionStatus::Completed).from(&[ExecutionStatus::Running]).owned_by(worker_id).check();
    let outcomes = without_nuls(done);
    let columns = SuccessColumns::of(done, &outcomes);
    let first = columns.ids.first().copied().unwrap_or_default();
    let changed = patiently(db, "recording successes", first, patience, |mut connection, doubt| {
        let columns = &columns;
        async move {
            // (after an outage, a success that landed is read back: completed here with its token)
            let rows = columns
                .bind(sqlx::query_as(
                    "SELECT id, status, action_ref, retry_count, worker \
                     FROM complete_runs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                ))
                .bind(worker_id)
                .bind(doubt)
                .fetch_all(&mut *connection)
                .await;
            (connection, rows)
        }
    })
    .await?;
    changed.iter().for_each(count_finished);
    Ok(changed)
}

/// A worker's claims and successes in one statement (`claim` and `complete` together, each row
/// with its own guard and fence): one round trip and one commit where there would be two.
/// Returns the runs it claimed and the rows it completed, as those two do, and meets an outage as
/// `patience` says, the same way.
pub async fn claim_and_complete(
    db: &PgPool,
    worker_id: i64,
    claims: &[(i64, &str)],
    done: &[(i64, &Outcome, Option<&str>)],
    patience: Patience,
) -> Result<(Vec<ClaimedRun>, Vec<Changed>), sqlx::Error> {
    Transition::claim(worker_id).check();
    Transition::to(ExecutionStatus::Completed).from(&[ExecutionStatus::Running]).owned_by(worker_id).check();
    let claim_ids: Vec<i64> = claims.iter().map(|(id, _)| *id).collect();
    let claim_tokens: Vec<&str> = claims.iter().map(|(_, token)| *token).collect();
    let outcomes = without_nuls(done);
    let columns = SuccessColumns::of(done, &outcomes);
    let first = claim_ids.first().or(columns.ids.first()).copied().unwrap_or_default();
    let rows = patiently(db, "claiming and recording runs", first, patience, |mut connection, doubt| {
        let (claim_ids, claim_tokens, columns) = (&claim_ids, &claim_tokens, &columns);
        async move {
            // (both functions run, each once: the claims first; a claimed row is `running`, a
            // recorded one `completed`, and no run is both claimed and recorded in one batch)
            let query = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH recorded AS MATERIALIZED \
                   (SELECT * FROM complete_runs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)), \
                 claimed AS MATERIALIZED (SELECT * FROM claim_runs($11, $12, $9, $10)), \
                 c AS (SELECT * FROM claimed UNION ALL SELECT * FROM recorded) \
                 SELECT {RUN_COLUMNS}"
            )));
            let rows: Result<Vec<ClaimedRun>, _> = columns
                .bind(query)
                .bind(worker_id)
                .bind(doubt)
                .bind(claim_ids)
                .bind(claim_tokens)
                .fetch_all(&mut *connection)
                .await;
            (connection, rows)
        }
    })
    .await?;
    // (a claim leaves its row running, a success completed)
    let (completed, claimed): (Vec<ClaimedRun>, Vec<ClaimedRun>) =
        rows.into_iter().partition(|row| row.status == ExecutionStatus::Completed);
    let completed: Vec<Changed> = completed
        .into_iter()
        .map(|row| Changed {
            id: row.id,
            status: row.status,
            action_ref: row.action_ref,
            retry_count: row.retry_count,
            worker: row.worker,
        })
        .collect();
    completed.iter().for_each(count_finished);
    Ok((claimed, completed))
}

/// The worker `worker_id` says the processes of the run `execution_id` (`None`: of all its runs)
/// are gone: a run ended by hand (`lingering`) frees its concurrency slot. How many did.
pub async fn release(db: &PgPool, execution_id: Option<i64>, worker_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT execution_released($1, $2)").bind(execution_id).bind(worker_id).fetch_one(db).await
}

/// `hand_back` as a worker makes it, through `execution_hand_back` (which runs as the schema's
/// owner and checks that the worker is one the caller's login registered: under row-level
/// security a worker's login may not write the handed-back row, on no worker, itself). With
/// `Patience::Surely`, finding nothing to hand back after an attempt that may have landed
/// unacknowledged is the answer (`None`): the row is either handed back already or has moved
/// on, and either way is no longer this worker's.
pub async fn hand_back_own(
    db: &PgPool,
    execution_id: i64,
    worker_id: i64,
    patience: Patience,
) -> Result<Option<Changed>, sqlx::Error> {
    patiently(db, "handing back a dispatch", execution_id, patience, |mut connection, _| async move {
        let answer = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM execution_hand_back($1, $2)",
            <Changed as TransitionRow>::COLUMNS
        )))
        .bind(execution_id)
        .bind(worker_id)
        .fetch_optional(&mut *connection)
        .await;
        (connection, answer)
    })
    .await
}

/// Whether the execution is still dispatched to this worker and not started (a dispatch that is
/// not is stale: canceled, handed back or taken elsewhere).
pub async fn still_dispatched(db: &PgPool, execution_id: i64, worker_id: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM execution WHERE id = $1 AND worker = $2 AND status = 'scheduled')")
        .bind(execution_id)
        .bind(worker_id)
        .fetch_one(db)
        .await
}

/// Of `ids` (executions running on this worker as far as it knows), those the database no
/// longer has running on it: canceled, failed by hand, or taken over. One indexed read by id.
pub async fn no_longer_running_on(db: &PgPool, worker_id: i64, ids: &[i64]) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM execution WHERE id = ANY($1) AND (status <> 'running' OR worker IS DISTINCT FROM $2)",
    )
    .bind(ids)
    .bind(worker_id)
    .fetch_all(db)
    .await
}

/// The executions dispatched to a worker and not started.
pub async fn scheduled_on(db: &PgPool, worker_id: i64) -> Result<Vec<i64>, sqlx::Error> {
    on_worker(db, worker_id, ExecutionStatus::Scheduled).await
}

/// The executions a worker is running, each with the run token its claim stored.
pub async fn runs_on(db: &PgPool, worker_id: i64) -> Result<Vec<(i64, Option<String>)>, sqlx::Error> {
    sqlx::query_as("SELECT id, run_token FROM execution WHERE worker = $1 AND status = $2 ORDER BY id")
        .bind(worker_id)
        .bind(ExecutionStatus::Running)
        .persistent(false)
        .fetch_all(db)
        .await
}

/// Whether the execution is still dispatched to or running on this worker: a cancel notice for
/// one that is did not come from a cancellation (the API changes the row before it sends one).
pub async fn still_on(db: &PgPool, execution_id: i64, worker_id: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM execution WHERE id = $1 AND worker = $2 AND status = ANY($3))")
        .bind(execution_id)
        .bind(worker_id)
        .bind(&ExecutionStatus::IN_FLIGHT[..])
        .fetch_one(db)
        .await
}

async fn on_worker(db: &PgPool, worker_id: i64, status: ExecutionStatus) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM execution WHERE worker = $1 AND status = $2 ORDER BY id")
        .bind(worker_id)
        .bind(status)
        .persistent(false)
        .fetch_all(db)
        .await
}

/// A worker's dispatches that it holds, delivered and not yet started, marked as still held
/// (`updated` set to now; no status changes), so that the monitor does not take them for lost.
pub async fn keep_held(db: &PgPool, worker_id: i64, execution_ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution SET updated = now() WHERE id = ANY($2) AND worker = $1 AND status = 'scheduled'")
        .bind(worker_id)
        .bind(execution_ids)
        .execute(db)
        .await?;
    Ok(())
}
