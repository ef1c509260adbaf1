//! A write whose commit acknowledgement is lost (the connection cut after the server committed,
//! before the answer arrived) is not mistaken for a stale message: the writer reads the row back
//! and carries on with what landed. The cut is made by a proxy in front of PostgreSQL
//! (`attune_testkit::pgcut`).

use attune_common::db::{self, execution::NewExecution, execution::Transition};
use attune_core::ExecutionStatus::{self, *};
use attune_testkit::TestDb;
use attune_testkit::pgcut::PgCut;
use serde_json::json;
use sqlx::PgPool;

async fn proxied(test: &TestDb) -> (PgCut, PgPool) {
    let cut = PgCut::start("127.0.0.1:5432").await;
    let pool = db::connect(&cut.url(&test.url), 2, std::time::Duration::from_secs(10)).await.unwrap();
    (cut, pool)
}

async fn execution_in(pool: &PgPool, status: ExecutionStatus, worker: i64) -> i64 {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    db::pack::register(pool, &attune_common::pack::load_pack(&dir).unwrap()).await.unwrap();
    let action = db::action::get_by_ref(pool, "core.echo").await.unwrap().unwrap();
    let new = NewExecution { runtime: Some(action.runtime.clone()), ..attune_testkit::echo_execution(&action) };
    let id = db::execution::insert(pool, &new).await.unwrap().id;
    sqlx::query("UPDATE execution SET status = $2, worker = $3 WHERE id = $1")
        .bind(id)
        .bind(status)
        .bind(worker)
        .execute(pool)
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn a_workers_claim_whose_answer_was_lost_is_still_its_claim() {
    let test = TestDb::new().await;
    let worker = db::worker::register(&test.pool, "w", &json!({"runtimes": ["shell"]})).await.unwrap();
    let id = execution_in(&test.pool, Scheduled, worker).await;
    let (cut, pool) = proxied(&test).await;
    cut.arm("UPDATE execution SET status");
    let claim = Transition::claim(worker);
    let claimed = db::execution::transition_with(&pool, "claiming", id, &claim, db::execution::Patience::Surely).await;
    assert_eq!(cut.sprung(), 1, "the answer to the claim was lost");
    let status: ExecutionStatus =
        sqlx::query_scalar("SELECT status FROM execution WHERE id = $1").bind(id).fetch_one(&test.pool).await.unwrap();
    assert_eq!(status, Running, "the claim landed");
    let claimed = claimed.unwrap();
    assert_eq!(claimed.map(|c| c.status), Some(Running), "the worker knows its claim landed");
    pool.close().await;
    test.drop_database().await;
}

#[tokio::test]
async fn a_claim_that_finds_nothing_without_an_error_is_stale_as_before() {
    // the read-back only follows an error: a claim of an execution that is no longer scheduled
    // here (canceled, taken elsewhere) is still a stale message
    let test = TestDb::new().await;
    let worker = db::worker::register(&test.pool, "w", &json!({"runtimes": ["shell"]})).await.unwrap();
    let other = db::worker::register(&test.pool, "other", &json!({"runtimes": ["shell"]})).await.unwrap();
    let id = execution_in(&test.pool, Running, other).await;
    let claim = Transition::claim(worker);
    let claimed = db::execution::transition_with(&test.pool, "claiming", id, &claim, db::execution::Patience::Surely)
        .await
        .unwrap();
    assert_eq!(claimed, None, "running on another worker: not this worker's claim");
    test.drop_database().await;
}

#[tokio::test]
async fn a_schedulers_claim_whose_answer_was_lost_is_read_back_and_dispatched() {
    let test = TestDb::new().await;
    let worker = db::worker::register(&test.pool, "w", &json!({"runtimes": ["shell"]})).await.unwrap();
    let id = execution_in(&test.pool, Requested, worker).await;
    sqlx::query("UPDATE execution SET worker = NULL WHERE id = $1").bind(id).execute(&test.pool).await.unwrap();
    let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&test.pool).await.unwrap();
    let (cut, pool) = proxied(&test).await;
    cut.arm("FROM execution_claim(");
    let claimed =
        db::execution::scheduler::claim_waiting(&pool, "shell", &[worker], since, db::execution::Patience::Surely)
            .await
            .unwrap();
    assert_eq!(cut.sprung(), 1, "the answer to the claim was lost");
    assert_eq!(claimed.iter().map(|c| (c.id, c.worker)).collect::<Vec<_>>(), [(id, worker)]);
    pool.close().await;
    test.drop_database().await;
}

/// An outage that wrote nothing (here a lock timeout: another executor's claim holds the
/// worker's turn) leaves nothing to read back: the claim is made again once the turn is free,
/// and what another executor claimed for the same worker meanwhile is not taken for this one's
/// (it would be dispatched twice, and handed back by this executor if its dispatch failed).
#[tokio::test]
async fn a_schedulers_claim_refused_by_a_lock_timeout_is_made_again_not_read_back() {
    let test = TestDb::new().await;
    let worker = db::worker::register(&test.pool, "w", &json!({"runtimes": ["shell"]})).await.unwrap();
    let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&test.pool).await.unwrap();
    // another executor's claim for the worker, just made
    let theirs = execution_in(&test.pool, Scheduled, worker).await;
    let mine = execution_in(&test.pool, Requested, worker).await;
    sqlx::query("UPDATE execution SET worker = NULL WHERE id = $1").bind(mine).execute(&test.pool).await.unwrap();
    // the worker's turn (`execution_claim`'s first lock) held by another session for a while
    let mut holder = test.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(1635022965, $1::int)")
        .bind(i32::try_from(worker).unwrap())
        .execute(&mut *holder)
        .await
        .unwrap();
    let options: sqlx::postgres::PgConnectOptions = test.url.parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.options([("lock_timeout", "100")]))
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        holder.commit().await.unwrap();
    });
    let claimed =
        db::execution::scheduler::claim_waiting(&pool, "shell", &[worker], since, db::execution::Patience::Surely)
            .await
            .unwrap();
    release.await.unwrap();
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), [mine], "not {theirs}, another's claim");
    pool.close().await;
    test.drop_database().await;
}
