//! Schedules: every `POLL`, the runs of the schedules that are due are created (see
//! `db::schedule::run_due`: each in the transaction that moves its schedule on, under the
//! schedule's row lock, so several executors create each run once, and one killed in the middle
//! leaves the schedule due for the next look). A run is a request like any other: the database
//! announces it to the schedulers at its commit.

use std::sync::Arc;
use std::time::Duration;

use attune_common::{db, metrics};
use tokio_util::sync::CancellationToken;

use crate::Context;

/// How often due schedules are looked for (a run starts at most this late, plus its claim).
const POLL: Duration = Duration::from_millis(250);
/// Most schedules moved on in one transaction.
const BATCH: i64 = 100;

pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    loop {
        let more = match tick(&context).await {
            Ok(moved) => moved as i64 >= BATCH,
            Err(e) => {
                tracing::warn!(error = %e, "schedule pass failed; the due runs are created at the next");
                false
            }
        };
        if more {
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// One pass; how many due schedules it moved on.
pub async fn tick(context: &Context) -> Result<usize, crate::Error> {
    let look = db::schedule::run_due(&context.db, BATCH, context.settings.common.default_timeout_secs).await?;
    for ran in &look.ran {
        tracing::info!(schedule = %ran.name, scheduled_for = %ran.scheduled_for, execution_id = ran.execution, "scheduled run requested");
    }
    if !look.ran.is_empty() {
        metrics::increment(&metrics::SCHEDULED_RUNS, &[], look.ran.len() as u64);
    }
    if look.missed > 0 {
        tracing::warn!(
            missed = look.missed,
            "scheduled occurrences older than the grace were missed (each schedule's catch_up says what was run for them)"
        );
        metrics::increment(&metrics::SCHEDULED_MISSED, &[], look.missed);
    }
    for (name, reason) in &look.stopped {
        tracing::warn!(schedule = %name, %reason, "a schedule whose token can no longer act was paused, not run");
    }
    for (name, reason) in &look.broken {
        tracing::error!(schedule = %name, %reason, "a schedule's timing no longer reads: it will not run until it is made again");
    }
    Ok(look.moved)
}
