//! Submissions share their commit. `POST /executions` hands its new execution to one writer task
//! and waits: the writer takes what is queued — one submission when the API is idle, everything
//! that arrived while its previous write was in flight under load — inserts it in one statement
//! (`db::execution::insert_many`, one commit), and publishes one request hint per action of the
//! batch (the rows are the requests; a hint only says a runtime has work) while it writes the
//! next batch. Each submission is answered once its row is committed and its hint published (or
//! given up after 2 s: the schedulers' sweep finds the row anyway), as before batching.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use attune_common::db::{self, execution::Execution, execution::NewExecution};
use attune_common::mq::{ExecutionRequest, Publisher, REQUEST_KEY};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

/// The most submissions one statement writes.
const MAX_BATCH: usize = 256;
/// How long a hint may wait for the broker's confirm before the submitters are answered anyway.
const HINT_PATIENCE: Duration = Duration::from_secs(2);

struct Pending {
    new: NewExecution,
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

    /// Inserts `new` (with whatever else is being submitted) and publishes its hint.
    pub async fn submit(&self, new: NewExecution) -> Result<Execution, sqlx::Error> {
        let (reply, answer) = oneshot::channel();
        self.queue.send(Pending { new, reply }).await.map_err(|_| sqlx::Error::PoolClosed)?;
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

/// The batch in one statement; if the database refuses it, each submission on its own, so that
/// one bad row fails only its own submission.
async fn insert(db: &PgPool, batch: &[Pending]) -> Vec<Result<Execution, sqlx::Error>> {
    let news: Vec<&NewExecution> = batch.iter().map(|p| &p.new).collect();
    match db::execution::insert_many(db, &news).await {
        Ok(rows) if rows.len() == batch.len() => return rows.into_iter().map(Ok).collect(),
        Ok(rows) => tracing::error!(expected = batch.len(), got = rows.len(), "a batch insert returned other rows"),
        Err(e) if batch.len() == 1 => return vec![Err(e)],
        Err(e) => tracing::warn!(error = %e, size = batch.len(), "batch insert refused; inserting one by one"),
    }
    let mut results = Vec::with_capacity(batch.len());
    for new in news {
        results.push(db::execution::insert(db, new).await);
    }
    results
}

/// One request hint per action of the batch: the executors mark its runtime and claim its rows.
async fn hint(publisher: &Publisher, results: &[Result<Execution, sqlx::Error>]) {
    let mut first_of_action: BTreeMap<Option<i64>, i64> = BTreeMap::new();
    for execution in results.iter().flatten() {
        first_of_action.entry(execution.action).or_insert(execution.id);
    }
    for (action_id, execution_id) in first_of_action {
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
    }
}
