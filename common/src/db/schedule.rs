//! Schedules (`crate::schedule` says when they run): made, changed and deleted by the API; moved
//! on by the executors, which create each due run in the transaction that moves the schedule's
//! `next_run` past it, under the schedule row's lock (`run_due`). A run is created once however
//! many executors look; an executor killed in the middle leaves the schedule due for the next
//! look; and the unique index `execution_one_per_occurrence` refuses a second first attempt for
//! one occurrence whatever happens.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use crate::schedule::{CatchUp, Timing};

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Schedule {
    pub id: i64,
    pub name: String,
    pub action_ref: String,
    /// As checked against the action's declarations when it was made (a secret one shown
    /// `[redacted]`).
    #[schema(value_type = Object)]
    #[serde(serialize_with = "crate::secrets::serialize_shown")]
    pub parameters: Value,
    /// A cron expression (5 fields, or 6 with seconds first) read in `timezone`; null for an
    /// instant (`at`).
    pub cron: Option<String>,
    pub timezone: String,
    pub at: Option<DateTime<Utc>>,
    /// `skip` or `once`: what a look after an outage does with occurrences older than 60 s.
    pub catch_up: String,
    pub paused: bool,
    /// The next occurrence to run; null: nothing more (an instant that came).
    pub next_run: Option<DateTime<Utc>>,
    pub last_run: Option<DateTime<Utc>>,
    /// The execution the last run made.
    pub last_execution: Option<i64>,
    pub reason: Option<String>,
    /// The token it runs as: the one that made it, or last resumed it.
    pub created_by: Option<i64>,
    /// Why it was stopped without a person asking (its token revoked or expired); cleared when
    /// it is resumed.
    pub paused_reason: Option<String>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
    /// Occurrences not run when due: no executor looked within the grace, or the action (or its
    /// runtime) was paused; `catch_up` said what stood for them.
    pub missed: i64,
    /// When a look last found a missed occurrence.
    pub last_missed: Option<DateTime<Utc>>,
}

impl Schedule {
    /// Its timing, as stored (checked when it was made).
    pub fn timing(&self) -> Result<Timing, (&'static str, String)> {
        match (&self.cron, self.at) {
            (Some(cron), _) => Timing::cron(cron, &self.timezone),
            (None, Some(at)) => Ok(Timing::At(at)),
            (None, None) => Err(("cron", "neither a cron expression nor an instant".into())),
        }
    }
}

const COLUMNS: &str = "id, name, action_ref, parameters, cron, timezone, at, catch_up, paused, next_run, \
    last_run, last_execution, reason, created_by, paused_reason, created, updated, missed, last_missed";

/// A schedule to make: its timing checked, its parameters checked (and sealed) by the API.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub name: String,
    pub action_ref: String,
    pub parameters: Value,
    pub cron: Option<String>,
    pub timezone: String,
    pub at: Option<DateTime<Utc>>,
    pub catch_up: CatchUp,
    pub paused: bool,
    pub next_run: Option<DateTime<Utc>>,
    pub reason: Option<String>,
    pub created_by: i64,
}

/// Makes `new`; `None` when a schedule of that name exists.
pub async fn create(db: impl sqlx::PgExecutor<'_>, new: &NewSchedule) -> Result<Option<Schedule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO schedule (name, action_ref, parameters, cron, timezone, at, catch_up, paused, next_run, \
         reason, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (name) DO NOTHING RETURNING {COLUMNS}"
    )))
    .bind(&new.name)
    .bind(&new.action_ref)
    .bind(&new.parameters)
    .bind(&new.cron)
    .bind(&new.timezone)
    .bind(new.at)
    .bind(new.catch_up.as_str())
    .bind(new.paused)
    .bind(new.next_run)
    .bind(&new.reason)
    .bind(new.created_by)
    .fetch_optional(db)
    .await
}

/// Replaces the definition of schedule `new.name` (its action, parameters, timing, catch-up,
/// reason and whether it is paused) with `new`'s; what it ran stays its own. `None`: no such
/// schedule.
pub async fn replace(db: impl sqlx::PgExecutor<'_>, new: &NewSchedule) -> Result<Option<Schedule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE schedule SET action_ref = $2, parameters = $3, cron = $4, timezone = $5, at = $6, catch_up = $7, \
            paused = $8, next_run = $9, reason = $10, created_by = $11, updated = now() \
         WHERE name = $1 RETURNING {COLUMNS}"
    )))
    .bind(&new.name)
    .bind(&new.action_ref)
    .bind(&new.parameters)
    .bind(&new.cron)
    .bind(&new.timezone)
    .bind(new.at)
    .bind(new.catch_up.as_str())
    .bind(new.paused)
    .bind(new.next_run)
    .bind(&new.reason)
    .bind(new.created_by)
    .fetch_optional(db)
    .await
}

/// Schedule `name`, kept from being deleted until the transaction ends: what a run made now of
/// it reads.
pub async fn get_to_run(db: impl sqlx::PgExecutor<'_>, name: &str) -> Result<Option<Schedule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM schedule WHERE name = $1 FOR KEY SHARE")))
        .bind(name)
        .fetch_optional(db)
        .await
}

pub async fn get(db: &PgPool, name: &str) -> Result<Option<Schedule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM schedule WHERE name = $1")))
        .bind(name)
        .fetch_optional(db)
        .await
}

/// Schedules by name, after `after` (a page), at most `limit`.
pub async fn list(db: &PgPool, after: Option<&str>, limit: i64) -> Result<Vec<Schedule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM schedule WHERE ($1::text IS NULL OR name > $1) ORDER BY name LIMIT $2"
    )))
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Pauses or resumes the schedule `name`. A paused schedule that is resumed waits for
/// `next_on_resume` of it (a cron schedule: its next occurrence from now, what came while it was
/// paused is not run; an instant that has passed: its catch-up policy). A schedule resumed runs
/// as the token `by` that resumed it from then on (its maker's may be revoked). On a pool it
/// commits; in a transaction it is a savepoint of it.
pub async fn set_paused(
    db: impl sqlx::Acquire<'_, Database = sqlx::Postgres>,
    name: &str,
    paused: bool,
    by: i64,
    next_on_resume: impl FnOnce(&Schedule) -> Option<DateTime<Utc>>,
) -> Result<Option<Schedule>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let current: Option<Schedule> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM schedule WHERE name = $1 FOR UPDATE")))
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(current) = current else { return Ok(None) };
    let resumed = !paused && current.paused;
    let next = if resumed { next_on_resume(&current) } else { current.next_run };
    let schedule = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE schedule SET paused = $2, next_run = $3, updated = now(), \
         created_by = CASE WHEN $4 THEN $5 ELSE created_by END, \
         paused_reason = CASE WHEN $4 THEN NULL ELSE paused_reason END WHERE id = $1 RETURNING {COLUMNS}"
    )))
    .bind(current.id)
    .bind(paused)
    .bind(next)
    .bind(resumed)
    .bind(by)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(schedule))
}

/// Pauses every running schedule that runs as the token `token_id` (being revoked), saying
/// `reason`; their names.
pub async fn pause_made_by(
    db: impl sqlx::PgExecutor<'_>,
    token_id: i64,
    reason: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE schedule SET paused = true, paused_reason = $2, updated = now() \
         WHERE created_by = $1 AND NOT paused RETURNING name",
    )
    .bind(token_id)
    .bind(reason)
    .fetch_all(db)
    .await
}

/// How many schedules run as the token `token_id`, counted under a lock of that token's own
/// (held until the transaction ends), so that two made at once cannot both pass a bound.
pub async fn count_made_by(db: &mut sqlx::PgConnection, token_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('attune.schedules_of_token', $1))")
        .bind(token_id)
        .execute(&mut *db)
        .await?;
    sqlx::query_scalar("SELECT count(*) FROM schedule WHERE created_by = $1").bind(token_id).fetch_one(&mut *db).await
}

/// Deletes the schedule `name` (the executions it made keep its id); the schedule as it was.
pub async fn delete(db: impl sqlx::PgExecutor<'_>, name: &str) -> Result<Option<Schedule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("DELETE FROM schedule WHERE name = $1 RETURNING {COLUMNS}")))
        .bind(name)
        .fetch_optional(db)
        .await
}

/// One run a look created.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    pub schedule: i64,
    pub name: String,
    pub scheduled_for: DateTime<Utc>,
    pub execution: i64,
}

/// What one look did.
#[derive(Debug, Default)]
pub struct Look {
    /// How many due schedules it moved on (the batch: more may be due).
    pub moved: usize,
    pub ran: Vec<Ran>,
    /// Occurrences older than the grace that were skipped or stood behind one catch-up run.
    pub missed: u64,
    /// Schedules whose stored timing no longer parses (left, with their next run cleared).
    pub broken: Vec<(String, String)>,
    /// Schedules stopped (paused) because their token can no longer act, and why.
    pub stopped: Vec<(String, String)>,
}

/// Creates the runs of up to `batch` due schedules (the oldest due first), each in the
/// transaction that moves its `next_run` on, with the database's clock; schedules another
/// executor is moving on are left to it (`SKIP LOCKED`). A run is a first attempt of the action
/// as it is now (its retry budget and timeout), with the schedule's parameters, submitted by the
/// schedule's maker; an action that no longer exists makes a run that fails as
/// `action_not_found`, as a submission would.
pub async fn run_due(db: &PgPool, batch: i64, default_timeout_secs: i32) -> Result<Look, sqlx::Error> {
    // (one statement, outside a transaction, while nothing is due)
    let any: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM schedule WHERE NOT paused AND next_run IS NOT NULL AND next_run <= now())",
    )
    .fetch_one(db)
    .await?;
    if !any {
        return Ok(Look::default());
    }
    let mut tx = db.begin().await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&mut *tx).await?;
    let due: Vec<Schedule> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM schedule WHERE NOT paused AND next_run <= $1 ORDER BY next_run LIMIT $2 \
         FOR UPDATE SKIP LOCKED"
    )))
    .bind(now)
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    // a schedule runs as its token: one whose token was revoked (while it was being made, or
    // past the API) or has expired is stopped, not run, and its stop audited
    let stopped: Vec<(String, String)> = sqlx::query_as(
        "UPDATE schedule s SET paused = true, updated = now(), paused_reason = format( \
             'stopped: the token it runs as (%s, ''%s'') %s', t.id, t.name, \
             CASE WHEN t.revoked IS NOT NULL THEN 'was revoked' ELSE 'has expired' END) \
         FROM api_token t WHERE s.id = ANY($1) AND t.id = s.created_by \
             AND (t.revoked IS NOT NULL OR t.expires <= $2) \
         RETURNING s.name, s.paused_reason",
    )
    .bind(due.iter().map(|s| s.id).collect::<Vec<i64>>())
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    for (name, reason) in &stopped {
        sqlx::query("SELECT audit_schedule_stopped($1, $2)").bind(name).bind(reason).execute(&mut *tx).await?;
    }
    let moved = due.len();
    let due: Vec<Schedule> = due.into_iter().filter(|s| !stopped.iter().any(|(name, _)| *name == s.name)).collect();
    let mut look = Look { moved, stopped, ..Look::default() };
    for schedule in due {
        let Some(next_run) = schedule.next_run else { continue };
        let timing = match schedule.timing() {
            Ok(timing) => timing,
            Err((_, reason)) => {
                sqlx::query("UPDATE schedule SET next_run = NULL, updated = now() WHERE id = $1")
                    .bind(schedule.id)
                    .execute(&mut *tx)
                    .await?;
                look.broken.push((schedule.name.clone(), reason));
                continue;
            }
        };
        let catch_up = CatchUp::parse(&schedule.catch_up).unwrap_or(CatchUp::Skip);
        // a paused action's occurrences do not pile up behind its pause: they are missed, and
        // `catch_up` says what stands for them (as after an outage)
        let (paused, waiting): (bool, bool) = sqlx::query_as(
            "SELECT paused, paused AND EXISTS (SELECT 1 FROM execution e WHERE e.schedule = $1 AND e.status = ANY($3)) \
             FROM (SELECT EXISTS (SELECT 1 FROM pause p WHERE (p.kind = 'action' AND p.name = $2) \
                 OR (p.kind = 'runtime' AND p.name = (SELECT a.runtime FROM action a WHERE a.ref = $2))) AS paused) AS x",
        )
        .bind(schedule.id)
        .bind(&schedule.action_ref)
        .bind(&attune_core::ExecutionStatus::NOT_STARTED[..])
        .fetch_one(&mut *tx)
        .await?;
        let due = match paused {
            true => timing.due_while_paused(next_run, now, catch_up, waiting),
            false => timing.due(next_run, now, catch_up),
        };
        look.missed += due.missed;
        let mut last: Option<(DateTime<Utc>, i64)> = None;
        for occurrence in due.run {
            let made: Option<i64> = sqlx::query_scalar(
                // made from the schedule's own row (the executors insert no execution of theirs)
                "SELECT schedule_fire($1, $2, $3)",
            )
            .bind(schedule.id)
            .bind(occurrence)
            .bind(default_timeout_secs)
            .fetch_one(&mut *tx)
            .await?;
            if let Some(execution) = made {
                look.ran.push(Ran {
                    schedule: schedule.id,
                    name: schedule.name.clone(),
                    scheduled_for: occurrence,
                    execution,
                });
                last = Some((occurrence, execution));
            }
        }
        sqlx::query(
            "UPDATE schedule SET next_run = $2, last_run = COALESCE($3, last_run), \
             last_execution = COALESCE($4, last_execution), updated = now(), missed = missed + $5, \
             last_missed = CASE WHEN $5 > 0 THEN now() ELSE last_missed END WHERE id = $1",
        )
        .bind(schedule.id)
        .bind(due.next)
        .bind(last.map(|(at, _)| at))
        .bind(last.map(|(_, id)| id))
        .bind(i64::try_from(due.missed).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(look)
}
