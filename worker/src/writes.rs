//! The worker's two writes on every execution, its claim (scheduled → running) and its record of
//! a success (running → completed), each made for many executions at once: what arrives while
//! the previous write of its kind is in flight goes into the next one (`attune_common::batch`),
//! and an execution alone is written at once. Each row keeps its own guard and fence (this
//! worker, the state, the run token), so a batch changes exactly the rows that one statement per
//! execution would. If the database refuses a batch for a reason other than an outage, its
//! executions are written one at a time, so that a bad row fails only itself.

use std::collections::{HashMap, HashSet};

use attune_common::batch::{Batcher, together_or_alone};
use attune_common::db::{self, execution::ClaimedRun, execution::Outcome};
use sqlx::PgPool;

/// The most executions one statement writes.
const MAX_BATCH: usize = 128;

pub(crate) struct Writes {
    claims: Batcher<(i64, String), Result<Option<ClaimedRun>, sqlx::Error>>,
    successes: Batcher<(i64, Outcome, Option<String>), Result<bool, sqlx::Error>>,
}

impl Writes {
    /// Starts the two writers on the current runtime.
    pub(crate) fn start(db: PgPool, worker_id: i64) -> Self {
        let pool = db.clone();
        let claims = Batcher::start(MAX_BATCH, move |items: Vec<(i64, String)>| {
            let db = pool.clone();
            async move { claim(&db, worker_id, &items).await }
        });
        let successes = Batcher::start(MAX_BATCH, move |items: Vec<(i64, Outcome, Option<String>)>| {
            let db = db.clone();
            async move { record(&db, worker_id, &items).await }
        });
        Writes { claims, successes }
    }

    /// Claims `execution_id` with `run_token` (see `db::execution::claim_surely`): `None` if it is
    /// not dispatched here (stale, duplicate or forged).
    pub(crate) async fn claim(&self, execution_id: i64, run_token: &str) -> Result<Option<ClaimedRun>, sqlx::Error> {
        self.claims.submit((execution_id, run_token.to_string())).await.unwrap_or(Err(sqlx::Error::PoolClosed))
    }

    /// Records a success, fenced by its run token: `false` if the execution no longer runs here
    /// (canceled or taken over).
    pub(crate) async fn record_success(
        &self,
        execution_id: i64,
        outcome: Outcome,
        run_token: Option<String>,
    ) -> Result<bool, sqlx::Error> {
        self.successes.submit((execution_id, outcome, run_token)).await.unwrap_or(Err(sqlx::Error::PoolClosed))
    }
}

async fn claim(db: &PgPool, worker_id: i64, items: &[(i64, String)]) -> Vec<Result<Option<ClaimedRun>, sqlx::Error>> {
    let claims: Vec<(i64, &str)> = items.iter().map(|(id, token)| (*id, token.as_str())).collect();
    let together = async {
        let mut runs: HashMap<i64, ClaimedRun> = db::execution::claim_many_surely(db, worker_id, &claims)
            .await?
            .into_iter()
            .map(|run| (run.id, run))
            .collect();
        Ok(items.iter().map(|(id, _)| runs.remove(id)).collect())
    };
    together_or_alone("claims", &claims, together, |(id, token)| db::execution::claim_surely(db, *id, worker_id, token))
        .await
}

async fn record(
    db: &PgPool,
    worker_id: i64,
    items: &[(i64, Outcome, Option<String>)],
) -> Vec<Result<bool, sqlx::Error>> {
    let done: Vec<(i64, &Outcome, Option<&str>)> =
        items.iter().map(|(id, outcome, token)| (*id, outcome, token.as_deref())).collect();
    let together = async {
        let changed = db::execution::complete_many_surely(db, worker_id, &done).await?;
        let recorded: HashSet<i64> = changed.iter().map(|row| row.id).collect();
        Ok(items.iter().map(|(id, _, _)| recorded.contains(id)).collect())
    };
    together_or_alone("successes", &done, together, |one| async move {
        let changed = db::execution::complete_many_surely(db, worker_id, std::slice::from_ref(one)).await?;
        Ok(!changed.is_empty())
    })
    .await
}
