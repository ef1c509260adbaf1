//! Submissions share their commit. `POST /executions` hands its new execution to one writer:
//! alone, it is inserted at once; under load, every submission that arrived while the previous
//! insert was in flight goes into the next one, a multi-row INSERT in one transaction
//! (`db::execution::api::insert_many_submitted`, over `attune_common::batch::Batcher`). A
//! submission is answered once its row is committed. The executors learn of it from PostgreSQL
//! itself, which announces the runtimes of new requests at that commit (`db::announcements`): the
//! API publishes nothing to the broker for a submission.
//!
//! A submission is answered with what happened to it. While it waits in the queue its request
//! may time out: it is then withdrawn (`server::Withdrawal`), and the writer leaves it out, so
//! the 503 the client gets is true. Once the writer has taken it into a batch, it is answered
//! with the batch's outcome however long that takes: its row, or the database's refusal. A batch
//! whose acknowledgement is lost with its connection is read back, not written again (see
//! `insert_many_submitted`).
//!
//! Manual retries and submissions with an `Idempotency-Key` are inserted on their own, in their
//! own transactions (and announced the same way).

use attune_common::batch::{Batcher, together_or_alone};
use attune_common::db::{
    self, execution::Execution, execution::NewExecution, execution::Patience, execution::Submitter,
};
use sqlx::PgPool;

use crate::server::Withdrawal;

/// The most submissions one statement writes.
const MAX_BATCH: usize = 256;
/// A submission's row, or why it was refused.
type Written = Result<Execution, sqlx::Error>;

/// A first attempt submitted by the token `submitted_by`, withdrawn if its request times out
/// before the writer takes it.
struct Submission {
    new: NewExecution,
    by: Submitter,
    withdrawal: Withdrawal,
}

/// The handle the routes submit through.
pub struct Submissions {
    /// `None` answers a withdrawn submission (to no one: its request has been answered).
    writes: Batcher<Submission, Option<Written>>,
}

impl Submissions {
    /// Starts the writer on the current runtime; it stops when the last handle is dropped.
    pub fn start(db: PgPool) -> Self {
        let writes = Batcher::start(MAX_BATCH, move |batch: Vec<Submission>| {
            let db = db.clone();
            async move { write(&db, batch).await }
        });
        Submissions { writes }
    }

    /// Inserts `new`, a first attempt submitted `by` a token (with its audit row when it asks for
    /// one), with whatever else is being submitted, and returns its committed row; written only
    /// if `withdrawal` has not been withdrawn by the time the writer takes it.
    pub async fn submit(
        &self,
        new: NewExecution,
        by: Submitter,
        withdrawal: Withdrawal,
    ) -> Result<Execution, sqlx::Error> {
        let submission = Submission { new, by, withdrawal };
        self.writes.submit(submission).await.flatten().ok_or(sqlx::Error::PoolClosed)?
    }
}

/// Writes the batch's submissions that were not withdrawn, and answers each in order.
async fn write(db: &PgPool, batch: Vec<Submission>) -> Vec<Option<Written>> {
    let taken: Vec<bool> = batch.iter().map(|submission| submission.withdrawal.begin_write()).collect();
    let news: Vec<(&NewExecution, &Submitter)> = batch
        .iter()
        .zip(&taken)
        .filter(|(_, taken)| **taken)
        .map(|(submission, _)| (&submission.new, &submission.by))
        .collect();
    if news.len() < batch.len() {
        tracing::debug!(withdrawn = batch.len() - news.len(), "submissions withdrawn by their request timeout");
    }
    let mut written = if news.is_empty() { Vec::new() } else { insert(db, &news).await }.into_iter();
    taken.into_iter().map(|taken| if taken { written.next() } else { None }).collect()
}

/// The batch in one statement (one transaction: all or nothing); if the database refuses it, each
/// submission on its own (`together_or_alone`). Both wait out a lost connection and never write
/// a row twice (`insert_many_submitted` with `Patience::Surely`).
async fn insert(db: &PgPool, news: &[(&NewExecution, &Submitter)]) -> Vec<Written> {
    let together = db::execution::api::insert_many_submitted(db, news, Patience::Surely);
    together_or_alone("submissions", news, together, |one| async move {
        let mut written =
            db::execution::api::insert_many_submitted(db, std::slice::from_ref(one), Patience::Surely).await?;
        written.pop().ok_or_else(|| sqlx::Error::Protocol("an insert of one submission returned no row".into()))
    })
    .await
}
