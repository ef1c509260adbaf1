//! Submissions share their commit and their hint. `POST /executions` hands its new execution to
//! one writer: alone, it is inserted at once; under load, every submission that arrived while the
//! previous insert was in flight goes into the next one, a multi-row INSERT in one transaction
//! (`db::execution::insert_many_submitted`). After each insert, one request hint per action of
//! the batch is published (the rows are the requests; a hint only says that a runtime has work,
//! see `attune_executor::scheduler`), while the writer goes on with the next batch. Each
//! submission is answered once its row is committed and its hint confirmed (or given up after
//! `HINT_PATIENCE`: the schedulers' sweep finds the row anyway), as when each had its own.
//!
//! Manual retries and submissions with an `Idempotency-Key` are inserted on their own, in their
//! own transactions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use attune_common::db::{self, execution::Execution, execution::NewExecution};
use attune_common::mq::{ExecutionRequest, Publisher, REQUEST_KEY};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

/// The most submissions one statement writes.
const MAX_BATCH: usize = 256;
/// How long a hint may wait for the broker's confirm before its submitters are answered anyway.
pub const HINT_PATIENCE: Duration = Duration::from_secs(2);

struct Pending {
    new: NewExecution,
    submitted_by: i64,
    reply: oneshot::Sender<Result<Execution, sqlx::Error>>,
}

/// The handle the routes submit through.
pub struct Submissions {
    queue: mpsc::Sender<Pending>,
}

impl Submissions {
    /// Starts the writer on the current runtime; it stops when the last handle is dropped.
    pub fn start(db: PgPool, publisher: Arc<Publisher>) -> Self {
        let (queue, pending) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(write(db, publisher, pending));
        Submissions { queue }
    }

    /// Inserts `new`, a first attempt submitted by the token `submitted_by`, with whatever else is
    /// being submitted, and publishes its hint.
    pub async fn submit(&self, new: NewExecution, submitted_by: i64) -> Result<Execution, sqlx::Error> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending { new, submitted_by, reply };
        self.queue.send(pending).await.map_err(|_| sqlx::Error::PoolClosed)?;
        answer.await.map_err(|_| sqlx::Error::PoolClosed)?
    }
}

async fn write(db: PgPool, publisher: Arc<Publisher>, mut pending: mpsc::Receiver<Pending>) {
    while let Some(first) = pending.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match pending.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let results = insert(&db, &batch).await;
        let publisher = publisher.clone();
        tokio::spawn(async move {
            hint(&publisher, &results).await;
            for (submission, result) in batch.into_iter().zip(results) {
                let _ = submission.reply.send(result);
            }
        });
    }
}

/// The batch in one statement (one transaction: all or nothing); if the database refuses it, each
/// submission on its own, so that one bad row fails only its own submission and each gets its
/// own error.
async fn insert(db: &PgPool, batch: &[Pending]) -> Vec<Result<Execution, sqlx::Error>> {
    let news: Vec<(&NewExecution, i64)> = batch.iter().map(|p| (&p.new, p.submitted_by)).collect();
    match db::execution::insert_many_submitted(db, &news).await {
        Ok(rows) if rows.len() == batch.len() => return rows.into_iter().map(Ok).collect(),
        Ok(rows) => tracing::error!(expected = batch.len(), got = rows.len(), "a batch insert returned other rows"),
        Err(e) if batch.len() == 1 => return vec![Err(e)],
        Err(e) => tracing::warn!(error = %e, size = batch.len(), "batch insert refused; inserting one by one"),
    }
    let mut results = Vec::with_capacity(batch.len());
    for (new, submitted_by) in news {
        results.push(db::execution::insert_submitted(db, new, Some(submitted_by)).await);
    }
    results
}

/// One request hint per action of the batch (its first execution's id): the executors mark the
/// action's runtime and claim its waiting rows.
async fn hint(publisher: &Publisher, results: &[Result<Execution, sqlx::Error>]) {
    let mut first_of_action: BTreeMap<Option<i64>, i64> = BTreeMap::new();
    for execution in results.iter().flatten() {
        first_of_action.entry(execution.action).or_insert(execution.id);
    }
    let hints = first_of_action.into_iter().map(|(action_id, execution_id)| async move {
        let request = ExecutionRequest { execution_id, action_id };
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
    });
    futures_util::future::join_all(hints).await;
}
