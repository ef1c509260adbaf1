//! The retry timer: turns `delayed` retries whose `not_before` has come into `requested` and
//! publishes their requests. Safe with several executors (`FOR UPDATE SKIP LOCKED` plus the
//! guarded status), and nothing waits in memory: a restarted executor finds every pending retry
//! in the database. A publish that fails after the promotion is re-sent by the monitor.

use std::sync::Arc;

use attune_common::db;
use attune_common::mq::{ExecutionRequest, REQUEST_KEY};
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

/// One pass: promote what is due and publish it.
pub async fn tick(context: &Context) -> Result<usize, crate::Error> {
    let due = db::execution::promote_due_retries(&context.db, BATCH).await?;
    for &(execution_id, action_id) in &due {
        tracing::debug!(execution_id, "retry due, requesting it");
        if let Err(e) = context.publisher.publish(REQUEST_KEY, &ExecutionRequest { execution_id, action_id }).await {
            tracing::warn!(execution_id, error = %e, "could not publish a due retry; the monitor will re-send it");
        }
    }
    Ok(due.len())
}
