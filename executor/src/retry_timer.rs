//! The retry timer: turns `delayed` retries whose `not_before` has come into `requested`, where
//! they wait for a worker like any request (oldest `not_before` first), and tells this
//! executor's scheduler. Safe with several executors (`FOR UPDATE SKIP LOCKED` plus the guarded
//! status), and nothing waits in memory: a restarted executor finds every pending retry in the
//! database, and every scheduler sweeps the waiting requests anyway.

use std::sync::Arc;

use attune_common::db;
use tokio_util::sync::CancellationToken;

use crate::Context;

const BATCH: i64 = 200;

pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    loop {
        let promoted = match tick(&context).await {
            Ok(promoted) => promoted,
            Err(e) => {
                tracing::warn!(error = %e, "retry timer pass failed");
                0
            }
        };
        if promoted as i64 == BATCH {
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(context.settings.retry_poll) => {}
        }
    }
}

/// One pass: move the circuits on (see `db::circuit::advance`), promote what is due, and wake
/// the scheduler for their runtimes.
pub async fn tick(context: &Context) -> Result<usize, crate::Error> {
    for runtime in db::circuit::advance(&context.db).await? {
        context.waiting.mark(&runtime);
    }
    let due = db::execution::monitor::promote_due_retries(&context.db, BATCH).await?;
    for (execution_id, runtime) in &due {
        tracing::debug!(execution_id, "retry due, requesting it");
        match runtime {
            Some(runtime) => context.waiting.mark(runtime),
            None => context.waiting.mark_all(),
        }
    }
    Ok(due.len())
}
