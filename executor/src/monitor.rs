//! The monitor: a singleton loop across executors (held by a PostgreSQL advisory lock) that
//! re-publishes executions left in `requested` — rows whose request message was never published
//! because the API crashed between its commit and its publish, or the broker was down.

use std::sync::Arc;
use std::time::Duration;

use attune_common::db;
use attune_common::mq::{ExecutionRequest, REQUEST_KEY};
use tokio_util::sync::CancellationToken;

use crate::Context;

/// The advisory lock key of the monitor ("attune" in ASCII, then 1).
const MONITOR_LOCK: i64 = 0x6174_7475_6e65_0001;

pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    let interval = (context.settings.requeue_after / 3).max(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if let Err(e) = tick(&context).await {
            tracing::warn!(error = %e, "monitor pass failed");
        }
    }
}

/// One pass, if this executor holds the singleton lock (session-level locks are tied to a
/// connection, so it is taken and released on one pooled connection).
pub async fn tick(context: &Context) -> Result<usize, crate::Error> {
    let mut connection = context.db.acquire().await?;
    let locked: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(MONITOR_LOCK).fetch_one(&mut *connection).await?;
    if !locked {
        return Ok(0);
    }
    let result = republish_stale_requests(context).await;
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(MONITOR_LOCK).execute(&mut *connection).await?;
    result
}

async fn republish_stale_requests(context: &Context) -> Result<usize, crate::Error> {
    let stale = db::execution::stale_requested(&context.db, context.settings.requeue_after.as_secs_f64(), 500).await?;
    for execution_id in &stale {
        tracing::warn!(execution_id, "execution stuck in requested, re-publishing its request");
        context.publisher.publish(REQUEST_KEY, &ExecutionRequest { execution_id: *execution_id }).await?;
    }
    Ok(stale.len())
}
