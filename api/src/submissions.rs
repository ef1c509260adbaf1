//! Submissions share their commit. `POST /executions` hands its new execution to one writer:
//! alone, it is inserted at once; under load, every submission that arrived while the previous
//! insert was in flight goes into the next one, a multi-row INSERT in one transaction
//! (`db::execution::insert_many_submitted`, over `attune_common::batch::Batcher`). A submission is
//! answered once its row is committed. The executors learn of it from PostgreSQL itself, which
//! announces the runtimes of new requests at that commit (`db::announcements`): the API publishes
//! nothing to the broker for a submission.
//!
//! Manual retries and submissions with an `Idempotency-Key` are inserted on their own, in their
//! own transactions (and announced the same way).

use attune_common::batch::{Batcher, together_or_alone};
use attune_common::db::{self, execution::Execution, execution::NewExecution};
use sqlx::PgPool;

/// The most submissions one statement writes.
const MAX_BATCH: usize = 256;
/// A submission's row, or why it was refused.
type Written = Result<Execution, sqlx::Error>;

/// The handle the routes submit through.
pub struct Submissions {
    writes: Batcher<(NewExecution, i64), Written>,
}

impl Submissions {
    /// Starts the writer on the current runtime; it stops when the last handle is dropped.
    pub fn start(db: PgPool) -> Self {
        let writes = Batcher::start(MAX_BATCH, move |batch: Vec<(NewExecution, i64)>| {
            let db = db.clone();
            async move { insert(&db, &batch).await }
        });
        Submissions { writes }
    }

    /// Inserts `new`, a first attempt submitted by the token `submitted_by`, with whatever else is
    /// being submitted, and returns its committed row.
    pub async fn submit(&self, new: NewExecution, submitted_by: i64) -> Result<Execution, sqlx::Error> {
        self.writes.submit((new, submitted_by)).await.ok_or(sqlx::Error::PoolClosed)?
    }
}

/// The batch in one statement (one transaction: all or nothing); if the database refuses it, each
/// submission on its own (`together_or_alone`).
async fn insert(db: &PgPool, batch: &[(NewExecution, i64)]) -> Vec<Written> {
    let news: Vec<(&NewExecution, i64)> = batch.iter().map(|(new, token)| (new, *token)).collect();
    let together = db::execution::insert_many_submitted(db, &news);
    together_or_alone("submissions", &news, together, |(new, submitted_by)| {
        db::execution::insert_submitted(db, new, Some(*submitted_by))
    })
    .await
}
