//! The history job: a singleton loop across executors, held by a PostgreSQL advisory lock like
//! the monitor, that keeps the record small and its statistics cheap.
//!
//! Each pass (every `ATTUNE_HISTORY_INTERVAL_SECS`):
//! - counts the minutes that are over into `execution_rollup` (`db::history::rollup`), which the
//!   statistics read instead of the history they stand for;
//! - removes the retry chains past their age (`attune_core::retention`; an action's own `retention:`
//!   block over the settings for the statuses it names), one finished status at
//!   a time, oldest first, in short transactions of `ATTUNE_RETENTION_BATCH` executions, archiving
//!   them first when `ATTUNE_RETENTION_ARCHIVE` is on, then the rows of long-inactive workers and
//!   rollup minutes past the longest statistics window;
//! - vacuums `execution` once it has removed a twentieth of it since the last vacuum (at least
//!   10,000 rows), so the space goes to new executions even where autovacuum is off.
//!
//! Nothing here is on an execution's path: the scheduler, workers and API never wait for it, and
//! a pass that fails is logged and tried again at the next interval.

use std::sync::Arc;

use attune_common::db;
use attune_core::ExecutionStatus;
use attune_core::retention::{Age, Retention};
use tokio_util::sync::CancellationToken;

use crate::Context;

/// The advisory lock key of the history job ("attune" in ASCII, then 2).
pub const HISTORY_LOCK: i64 = 0x6174_7475_6e65_0002;
/// Removed rows after which the job vacuums, at least.
const VACUUM_AFTER_ROWS: i64 = 10_000;

/// The history job's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct HistorySettings {
    pub retention: Retention,
    pub workers: Age,
    /// How long an audit event is kept.
    pub audit: Age,
    pub archive: bool,
    pub interval: std::time::Duration,
    pub batch: i64,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    pub removed: i64,
    pub workers_removed: u64,
    pub audit_removed: u64,
}

pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    let mut progress = Progress::default();
    // the database keeps audit events at least its own age, whatever this setting says
    if let Some(age) = context.settings.history.audit.secs()
        && let Ok(floor) = db::audit::retention_floor_secs(&context.db).await
        && age < floor
    {
        tracing::warn!(
            setting_secs = age,
            floor_secs = floor,
            "ATTUNE_RETENTION_AUDIT is shorter than the database's audit_retention.min_age: audit events are kept until that age (its owner may lower it)"
        );
    }
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(context.settings.history.interval) => {}
        }
        match tick(&context, &shutdown, &mut progress).await {
            Ok(Some(pass)) if pass.removed > 0 || pass.workers_removed > 0 || pass.audit_removed > 0 => {
                tracing::info!(
                    removed = pass.removed,
                    workers_removed = pass.workers_removed,
                    audit_removed = pass.audit_removed,
                    "history pass"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "history pass failed"),
        }
    }
}

/// What the job carries from one pass to the next.
#[derive(Debug, Default)]
pub struct Progress {
    /// Rows removed since the last vacuum (it decides the next).
    pub removed_since_vacuum: i64,
    /// Where each status's walk resumes: a pass walks at most `BATCHES_PER_PASS` batches of a
    /// status (chains kept past its age, by a longer age of one of their attempts or of their
    /// action, are walked again on every cycle).
    resume: std::collections::HashMap<ExecutionStatus, i64>,
}

/// The most batches of one status a pass walks; the next pass goes on from there.
const BATCHES_PER_PASS: usize = 100;

/// One pass, if this executor holds the singleton lock; `None` when another one does.
pub async fn tick(
    context: &Context,
    shutdown: &CancellationToken,
    progress: &mut Progress,
) -> Result<Option<Pass>, crate::Error> {
    let lease = crate::monitor::LEADER_LEASE;
    let Some(leadership) = db::leader::Leadership::try_take(&context.db, HISTORY_LOCK, lease).await? else {
        return Ok(None);
    };
    leadership.run(pass(context, shutdown, progress)).await?.map(Some)
}

async fn pass(context: &Context, shutdown: &CancellationToken, progress: &mut Progress) -> Result<Pass, crate::Error> {
    let settings = &context.settings.history;
    // the rollup first: what retention removes next must have been counted
    db::history::rollup(&context.db).await?;
    let mut pass = Pass::default();
    for status in ExecutionStatus::TERMINAL {
        let mut after = progress.resume.remove(&status).unwrap_or(0);
        let mut batches = 0;
        while !shutdown.is_cancelled() {
            if batches == BATCHES_PER_PASS {
                progress.resume.insert(status, after);
                break;
            }
            batches += 1;
            let batch = match db::history::prune_batch(
                &context.db,
                &settings.retention,
                status,
                after,
                settings.batch,
                settings.archive,
            )
            .await
            {
                Ok(batch) => batch,
                // foreign_key_violation: an operator retried an execution of the batch while it
                // was being removed; the chain is live again, and the next pass sees it so
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23503") => {
                    tracing::debug!(%status, after, "a chain came back to life during removal; left for the next pass");
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            pass.removed += batch.removed;
            match batch.last {
                Some(last) if batch.examined == settings.batch => after = last,
                _ => break,
            }
        }
    }
    if let Some(age) = settings.workers.secs() {
        pass.workers_removed = db::history::prune_workers(&context.db, age).await?;
    }
    if let Some(age) = settings.audit.secs() {
        for _ in 0..BATCHES_PER_PASS {
            let removed = db::audit::prune(&context.db, age, settings.batch, settings.archive).await?;
            pass.audit_removed += removed;
            if removed < settings.batch as u64 || shutdown.is_cancelled() {
                break;
            }
        }
    }
    db::history::prune_rollup(&context.db).await?;
    progress.removed_since_vacuum += pass.removed;
    if progress.removed_since_vacuum >= VACUUM_AFTER_ROWS.max(db::history::estimated_rows(&context.db).await? / 20) {
        db::history::vacuum(&context.db).await?;
        progress.removed_since_vacuum = 0;
    }
    Ok(pass)
}
