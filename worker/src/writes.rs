//! The worker's two writes on every execution, its claim (scheduled → running) and its record of
//! a success (running → completed), made by one writer for many executions at once: what arrives
//! while the previous write is in flight goes into the next one (`attune_common::batch`), claims
//! and successes together in one statement, and an execution alone is written at once. Each row
//! keeps its own guard and fence (this worker, the state, the run token), so a batch changes
//! exactly the rows that one statement per execution would. If the database refuses a batch for a
//! reason other than an outage, its claims and its successes are written apart, and then one at a
//! time, so that a bad row fails only itself.

use std::collections::{HashMap, HashSet};

use attune_common::batch::{Batcher, together_or_alone};
use attune_common::db::{self, execution::Outcome, execution::Patience, execution::worker::ClaimedRun};
use sqlx::PgPool;

/// The most executions one statement writes.
const MAX_BATCH: usize = 128;

pub(crate) struct Writes {
    writer: Batcher<Write, Written>,
}

/// One write the writer takes.
enum Write {
    Claim(i64, String),
    Success(i64, Outcome, Option<String>),
}

/// Its answer (moved once, through the writer's reply channel: not worth a box).
#[allow(clippy::large_enum_variant)]
enum Written {
    Claim(Result<Option<ClaimedRun>, sqlx::Error>),
    Success(Result<bool, sqlx::Error>),
}

impl Writes {
    /// Starts the writer on the current runtime.
    pub(crate) fn start(db: PgPool, worker_id: i64) -> Self {
        let writer = Batcher::start(MAX_BATCH, move |items: Vec<Write>| {
            let db = db.clone();
            async move { write(&db, worker_id, items).await }
        });
        Writes { writer }
    }

    /// Claims `execution_id` with `run_token` (see `db::execution::worker::claim`, waiting out an
    /// outage): `None` if it is not dispatched here (stale, duplicate or forged).
    pub(crate) async fn claim(&self, execution_id: i64, run_token: &str) -> Result<Option<ClaimedRun>, sqlx::Error> {
        match self.writer.submit(Write::Claim(execution_id, run_token.to_string())).await {
            Some(Written::Claim(claimed)) => claimed,
            _ => Err(sqlx::Error::PoolClosed),
        }
    }

    /// Records a success, fenced by its run token: `false` if the execution no longer runs here
    /// (canceled or taken over).
    pub(crate) async fn record_success(
        &self,
        execution_id: i64,
        outcome: Outcome,
        run_token: Option<String>,
    ) -> Result<bool, sqlx::Error> {
        match self.writer.submit(Write::Success(execution_id, outcome, run_token)).await {
            Some(Written::Success(recorded)) => recorded,
            _ => Err(sqlx::Error::PoolClosed),
        }
    }
}

/// A batch: its claims and its successes in one statement when it has both (apart if the database
/// refuses that one), else the one kind it has. One answer per item, in order.
async fn write(db: &PgPool, worker_id: i64, items: Vec<Write>) -> Vec<Written> {
    let is_claim: Vec<bool> = items.iter().map(|item| matches!(item, Write::Claim(..))).collect();
    let mut claims = Vec::new();
    let mut successes = Vec::new();
    for item in items {
        match item {
            Write::Claim(id, token) => claims.push((id, token)),
            Write::Success(id, outcome, token) => successes.push((id, outcome, token)),
        }
    }
    let (claimed, recorded) = if claims.is_empty() || successes.is_empty() {
        (claim(db, worker_id, &claims).await, record(db, worker_id, &successes).await)
    } else {
        let pairs: Vec<(i64, &str)> = claims.iter().map(|(id, token)| (*id, token.as_str())).collect();
        let done: Vec<(i64, &Outcome, Option<&str>)> =
            successes.iter().map(|(id, outcome, token)| (*id, outcome, token.as_deref())).collect();
        match db::execution::worker::claim_and_complete(db, worker_id, &pairs, &done, Patience::Surely).await {
            Ok((runs, changed)) => {
                let mut runs: HashMap<i64, ClaimedRun> = runs.into_iter().map(|run| (run.id, run)).collect();
                let changed: HashSet<i64> = changed.iter().map(|row| row.id).collect();
                (
                    claims.iter().map(|(id, _)| Ok(runs.remove(id))).collect(),
                    successes.iter().map(|(id, _, _)| Ok(changed.contains(id))).collect(),
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, claims = claims.len(), successes = successes.len(), "the database refused a batch of claims and successes; writing them apart");
                (claim(db, worker_id, &claims).await, record(db, worker_id, &successes).await)
            }
        }
    };
    let (mut claimed, mut recorded) = (claimed.into_iter(), recorded.into_iter());
    is_claim
        .into_iter()
        .map(|claim| match claim {
            true => Written::Claim(claimed.next().unwrap_or(Err(sqlx::Error::PoolClosed))),
            false => Written::Success(recorded.next().unwrap_or(Err(sqlx::Error::PoolClosed))),
        })
        .collect()
}

async fn claim(db: &PgPool, worker_id: i64, items: &[(i64, String)]) -> Vec<Result<Option<ClaimedRun>, sqlx::Error>> {
    if items.is_empty() {
        return Vec::new();
    }
    let claims: Vec<(i64, &str)> = items.iter().map(|(id, token)| (*id, token.as_str())).collect();
    let together = async {
        let mut runs: HashMap<i64, ClaimedRun> = db::execution::worker::claim(db, worker_id, &claims, Patience::Surely)
            .await?
            .into_iter()
            .map(|run| (run.id, run))
            .collect();
        Ok(items.iter().map(|(id, _)| runs.remove(id)).collect())
    };
    together_or_alone("claims", &claims, together, |one| async move {
        Ok(db::execution::worker::claim(db, worker_id, std::slice::from_ref(one), Patience::Surely).await?.pop())
    })
    .await
}

async fn record(
    db: &PgPool,
    worker_id: i64,
    items: &[(i64, Outcome, Option<String>)],
) -> Vec<Result<bool, sqlx::Error>> {
    if items.is_empty() {
        return Vec::new();
    }
    let done: Vec<(i64, &Outcome, Option<&str>)> =
        items.iter().map(|(id, outcome, token)| (*id, outcome, token.as_deref())).collect();
    let together = async {
        let changed = db::execution::worker::complete(db, worker_id, &done, Patience::Surely).await?;
        let recorded: HashSet<i64> = changed.iter().map(|row| row.id).collect();
        Ok(items.iter().map(|(id, _, _)| recorded.contains(id)).collect())
    };
    together_or_alone("successes", &done, together, |one| async move {
        let changed =
            db::execution::worker::complete(db, worker_id, std::slice::from_ref(one), Patience::Surely).await?;
        Ok(!changed.is_empty())
    })
    .await
}
