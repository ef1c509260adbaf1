//! Submissions share their commit and their hint. `POST /executions` hands its new execution to
//! one writer: alone, it is inserted at once; under load, every submission that arrived while the
//! previous insert was in flight goes into the next one, a multi-row INSERT in one transaction
//! (`db::execution::insert_many_submitted`, over `attune_common::batch::Batcher`). After each
//! insert, one request hint per action of the batch is published, by that action's first
//! submitter in the batch (the rows are the requests; a hint only says that a runtime has work,
//! see `attune_executor::scheduler`), while the writer goes on with the next batch. A submission
//! is answered once its row is committed (and, for the one that carries it, its hint confirmed or
//! given up after `HINT_PATIENCE`: the schedulers' sweep finds the rows anyway).
//!
//! Manual retries and submissions with an `Idempotency-Key` are inserted on their own, in their
//! own transactions.

use std::collections::HashSet;
use std::time::Duration;

use attune_common::batch::Batcher;
use attune_common::db::{self, execution::Execution, execution::NewExecution};
use attune_common::mq::{ExecutionRequest, Publisher, REQUEST_KEY};
use sqlx::PgPool;

/// The most submissions one statement writes.
const MAX_BATCH: usize = 256;
/// How long a hint may wait for the broker's confirm before its submitters are answered anyway.
pub const HINT_PATIENCE: Duration = Duration::from_secs(2);

/// A submission's row, and whether its submitter publishes the hint of its action's batch.
type Written = (Result<Execution, sqlx::Error>, bool);

/// The handle the routes submit through.
pub struct Submissions {
    writes: Batcher<(NewExecution, i64), Written>,
    publisher: std::sync::Arc<Publisher>,
}

impl Submissions {
    /// Starts the writer on the current runtime; it stops when the last handle is dropped.
    pub fn start(db: PgPool, publisher: std::sync::Arc<Publisher>) -> Self {
        let writes = Batcher::start(MAX_BATCH, move |batch: Vec<(NewExecution, i64)>| {
            let db = db.clone();
            async move { insert(&db, &batch).await }
        });
        Submissions { writes, publisher }
    }

    /// Inserts `new`, a first attempt submitted by the token `submitted_by`, with whatever else is
    /// being submitted, and publishes its action's hint if it is that action's first in its batch
    /// (the others of the batch are answered without waiting for it: their rows are committed, and
    /// the hint or the schedulers' sweep finds them all).
    pub async fn submit(&self, new: NewExecution, submitted_by: i64) -> Result<Execution, sqlx::Error> {
        let (written, hints) = self.writes.submit((new, submitted_by)).await.ok_or(sqlx::Error::PoolClosed)?;
        let execution = written?;
        if hints {
            publish_hint(&self.publisher, &execution).await;
        }
        Ok(execution)
    }
}

/// The batch in one statement (one transaction: all or nothing); if the database refuses it, each
/// submission on its own, so that one bad row fails only its own submission and each gets its
/// own error. The first execution of each action in the batch carries its hint.
async fn insert(db: &PgPool, batch: &[(NewExecution, i64)]) -> Vec<Written> {
    let news: Vec<(&NewExecution, i64)> = batch.iter().map(|(new, token)| (new, *token)).collect();
    let results = match db::execution::insert_many_submitted(db, &news).await {
        Ok(rows) if rows.len() == batch.len() => rows.into_iter().map(Ok).collect(),
        Ok(rows) => {
            tracing::error!(expected = batch.len(), got = rows.len(), "a batch insert returned other rows");
            one_by_one(db, &news).await
        }
        Err(e) if batch.len() == 1 => vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "batch insert refused; inserting one by one");
            one_by_one(db, &news).await
        }
    };
    let mut hinted = HashSet::new();
    results
        .into_iter()
        .map(|result| {
            let hints = result.as_ref().is_ok_and(|execution| hinted.insert(execution.action));
            (result, hints)
        })
        .collect()
}

async fn one_by_one(db: &PgPool, news: &[(&NewExecution, i64)]) -> Vec<Result<Execution, sqlx::Error>> {
    let mut results = Vec::with_capacity(news.len());
    for (new, submitted_by) in news {
        results.push(db::execution::insert_submitted(db, new, Some(*submitted_by)).await);
    }
    results
}

/// Publishes the request hint of a committed execution: the executors mark its action's runtime
/// and claim its waiting rows. The row is the request: if this publish fails, the schedulers'
/// once-a-second sweep of waiting rows finds it. Waits at most `HINT_PATIENCE` for the broker: a
/// client's submission is answered either way.
pub async fn publish_hint(publisher: &Publisher, execution: &Execution) {
    let execution_id = execution.id;
    let request = ExecutionRequest { execution_id, action_id: execution.action };
    match tokio::time::timeout(HINT_PATIENCE, publisher.publish(REQUEST_KEY, &request)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(execution_id, error = %e, "could not publish the request hint; the schedulers' sweep finds it")
        }
        Err(_) => tracing::warn!(
            execution_id,
            "the broker is slow to confirm the request hint; the schedulers' sweep finds it"
        ),
    }
}
