//! The `action_circuit` table: each action's circuit breaker (`attune_core::circuit` decides).
//!
//! The RetryManager evaluates a circuit after each counted failure, in the failure's own
//! transaction, with the row locked (`lock`, `window`, `store`). The retry timer moves open
//! circuits whose period is over to half-open and picks their trial, and closes a circuit whose
//! trial completed (`advance`). The scheduler's claim skips every waiting execution of an action
//! whose circuit is not closed, except its trial (`db::execution::scheduler::claim_waiting`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgExecutor, PgPool};

use attune_core::circuit::{Circuit, CircuitState, Window};

/// How many of an action's newest executions the window looks at, at most: the count stays one
/// short index scan however long the action's history.
pub const WINDOW_ROWS: i64 = 1000;

/// An action's circuit as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct CircuitView {
    /// `closed`, `open` or `half_open`.
    pub state: String,
    pub open_until: Option<DateTime<Utc>>,
    /// The execution let through while half-open.
    pub trial: Option<i64>,
    pub closed_at: DateTime<Utc>,
    /// Finished and failed executions in the window at the last evaluation.
    pub window_finished: i32,
    pub window_failed: i32,
    /// How many times it opened.
    pub opened_count: i64,
    pub updated: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct Row {
    state: String,
    open_until: Option<DateTime<Utc>>,
    trial: Option<i64>,
    closed_at: DateTime<Utc>,
}

impl From<Row> for Circuit {
    fn from(row: Row) -> Self {
        Circuit {
            state: CircuitState::parse(&row.state).unwrap_or(CircuitState::Closed),
            open_until: row.open_until,
            trial: row.trial,
            closed_at: row.closed_at,
        }
    }
}

/// The action's circuit, locked for this transaction (created closed if it has none).
pub async fn lock(tx: &mut PgConnection, action: i64) -> Result<Circuit, sqlx::Error> {
    sqlx::query("INSERT INTO action_circuit (action) VALUES ($1) ON CONFLICT (action) DO NOTHING")
        .bind(action)
        .execute(&mut *tx)
        .await?;
    let row: Row =
        sqlx::query_as("SELECT state, open_until, trial, closed_at FROM action_circuit WHERE action = $1 FOR UPDATE")
            .bind(action)
            .fetch_one(&mut *tx)
            .await?;
    Ok(row.into())
}

/// The action's circuit, if it has one.
pub async fn get(db: impl PgExecutor<'_>, action: i64) -> Result<Option<Circuit>, sqlx::Error> {
    let row: Option<Row> =
        sqlx::query_as("SELECT state, open_until, trial, closed_at FROM action_circuit WHERE action = $1")
            .bind(action)
            .fetch_optional(db)
            .await?;
    Ok(row.map(Into::into))
}

/// The action's executions that finished since `since` (among its newest `WINDOW_ROWS`), and
/// those of them that failed by a counted kind (`attune_core::circuit::counts`).
pub async fn window(db: impl PgExecutor<'_>, action_ref: &str, since: DateTime<Utc>) -> Result<Window, sqlx::Error> {
    use attune_core::{ExecutionStatus::*, FailureKind};
    let counted: Vec<&str> =
        FailureKind::ALL.into_iter().filter(|k| attune_core::circuit::counts(*k)).map(FailureKind::as_str).collect();
    let (finished, failed): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = ANY($4)), \
                count(*) FILTER (WHERE status = ANY($5) AND failure_kind = ANY($6)) \
         FROM (SELECT status, failure_kind, finished FROM execution WHERE action_ref = $1 \
               ORDER BY id DESC LIMIT $3) newest \
         WHERE finished >= $2",
    )
    .bind(action_ref)
    .bind(since)
    .bind(WINDOW_ROWS)
    .bind(&[Completed, Failed, Timeout][..])
    .bind(&[Failed, Timeout][..])
    .bind(&counted)
    .fetch_one(db)
    .await?;
    Ok(Window { finished, failed })
}

/// Writes the circuit evaluated with `window`.
pub async fn store(
    tx: &mut PgConnection,
    action: i64,
    before: &Circuit,
    after: &Circuit,
    window: Window,
) -> Result<(), sqlx::Error> {
    let opened = before.state != CircuitState::Open && after.state == CircuitState::Open;
    sqlx::query(
        "UPDATE action_circuit SET state = $2, open_until = $3, trial = $4, closed_at = $5, \
            window_finished = $6, window_failed = $7, opened_count = opened_count + $8::int, updated = now() \
         WHERE action = $1",
    )
    .bind(action)
    .bind(after.state.as_str())
    .bind(after.open_until)
    .bind(after.trial)
    .bind(after.closed_at)
    .bind(window.finished.min(i64::from(i32::MAX)) as i32)
    .bind(window.failed.min(i64::from(i32::MAX)) as i32)
    .bind(i32::from(opened))
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The circuits' timed steps, for every action at once: an open circuit whose period is over
/// becomes half-open; a half-open circuit without a live trial takes the action's oldest waiting
/// execution as its trial; a half-open circuit whose trial completed closes. Returns the runtimes
/// of the actions that got a trial (their scheduler should look).
pub async fn advance(db: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query(
        "UPDATE action_circuit c SET state = 'closed', open_until = NULL, trial = NULL, closed_at = now(), \
            updated = now() \
         WHERE c.state = 'half_open' \
           AND (SELECT t.status FROM execution t WHERE t.id = c.trial) = 'completed'",
    )
    .execute(&mut *tx)
    .await?;
    let runtimes: Vec<Option<String>> = sqlx::query_scalar(
        "WITH due AS ( \
            SELECT c.action FROM action_circuit c \
            WHERE (c.state = 'open' AND c.open_until <= now()) \
               OR (c.state = 'half_open' AND (c.trial IS NULL OR COALESCE( \
                    (SELECT t.status = ANY($1) FROM execution t WHERE t.id = c.trial), true))) \
            FOR UPDATE SKIP LOCKED), \
         picked AS ( \
            SELECT due.action, ( \
                SELECT e.id FROM execution e WHERE e.action = due.action AND e.status = 'requested' \
                ORDER BY COALESCE(e.not_before, e.created), e.id LIMIT 1) AS trial \
            FROM due) \
         UPDATE action_circuit c SET state = 'half_open', trial = picked.trial, updated = now() \
         FROM picked WHERE c.action = picked.action \
         RETURNING (SELECT e.runtime FROM execution e WHERE e.id = picked.trial)",
    )
    .bind(&attune_core::ExecutionStatus::TERMINAL[..])
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(runtimes.into_iter().flatten().collect())
}

/// Every circuit by action ref, for the `attune_action_circuit_state` gauge: each one evaluated,
/// and each action whose pack gives it a circuit breaker (closed until its first evaluation).
pub async fn states(db: &PgPool) -> Result<Vec<(String, CircuitState)>, sqlx::Error> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT a.ref, COALESCE(c.state, 'closed') FROM action a LEFT JOIN action_circuit c ON c.action = a.id \
         WHERE c.action IS NOT NULL OR a.retry_policy ? 'circuit' ORDER BY a.ref",
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(action, state)| (action, CircuitState::parse(&state).unwrap_or(CircuitState::Closed)))
        .collect())
}

/// An action's circuit for the API.
pub async fn view(db: impl PgExecutor<'_>, action: i64) -> Result<Option<CircuitView>, sqlx::Error> {
    sqlx::query_as(
        "SELECT state, open_until, trial, closed_at, window_finished, window_failed, opened_count, updated \
         FROM action_circuit WHERE action = $1",
    )
    .bind(action)
    .fetch_optional(db)
    .await
}
