//! Submissions whose answer is not what happened (issue 31, S4): a submission the client is told
//! failed must leave nothing behind, and a submission written must be answered with its id. Two
//! ways this went wrong:
//!
//! - the request timeout answered 503 `request_timeout … try again` while the submission waited
//!   in the batch writer's queue, and the writer wrote it anyway once the database let it: a
//!   client that tried again, as told, got two executions for one request;
//! - a batch whose commit acknowledgement was lost (the connection cut after `COMMIT`) was taken
//!   for refused and written again row by row (or, alone, answered as failed).
//!
//! The first is measured from outside, against the real `attune-api` binary with the
//! `execution` table locked past the request timeout; the second drives the API's batch writer
//! (`attune_api::submissions`) through `PgCut`, which loses exactly one acknowledgement.

use std::collections::HashMap;
use std::time::Duration;

use attune_api::server::Withdrawal;
use attune_api::submissions::Submissions;
use attune_common::db::{self, execution::NewExecution};
use attune_testkit::api::Api;
use attune_testkit::pgcut::PgCut;
use attune_testkit::{TestDb, wait_for};
use serde_json::{Value, json};
use sqlx::PgPool;

/// Submits `core.noop` with `config.request = request` (how the test tells the submissions
/// apart: the config is stored as given) and returns the answer's status and body.
async fn submit(api: &Api, request: i64) -> (u16, Value) {
    api.post("/api/v1/executions", &json!({"action_ref": "core.noop", "config": {"request": request}}), None).await
}

/// For each `config.request`, the ids of the executions written for it.
async fn written(pool: &PgPool) -> HashMap<i64, Vec<i64>> {
    let rows: Vec<(i64, Option<i64>)> =
        sqlx::query_as("SELECT id, (config->>'request')::bigint FROM execution ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    let mut written: HashMap<i64, Vec<i64>> = HashMap::new();
    for (id, request) in rows {
        written.entry(request.expect("every execution carries its request")).or_default().push(id);
    }
    written
}

/// Waits until some session waits for a lock on the `execution` table (the insert the test's
/// lock holds back).
async fn until_an_insert_waits_for_the_lock(pool: &PgPool) {
    wait_for("an insert to wait for the lock on execution", Duration::from_secs(20), || async {
        let waiting: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'execution'::regclass")
                .fetch_one(pool)
                .await
                .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
}

const SUBMISSIONS: i64 = 20;
/// The request timeout of the scenario, and how long the table stays locked: three of them.
const REQUEST_TIMEOUT_SECS: u64 = 2;
const LOCK_HELD: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_answered_503_left_nothing_behind_and_one_answered_201_names_its_execution() {
    let timeout = REQUEST_TIMEOUT_SECS.to_string();
    let api = Api::start(&[("ATTUNE_API_REQUEST_TIMEOUT_SECS", timeout.as_str())], None).await;
    // the scenario: the table locked (a long migration, a `VACUUM FULL`, a stuck transaction)
    // for three request timeouts while clients submit
    let mut lock = api.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE execution IN ACCESS EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();
    let api = std::sync::Arc::new(api);
    let answers: Vec<_> = (0..SUBMISSIONS)
        .map(|request| {
            let api = api.clone();
            tokio::spawn(async move { (request, submit(&api, request).await) })
        })
        .collect();
    tokio::time::sleep(LOCK_HELD).await;
    lock.rollback().await.unwrap();
    let mut answers = futures_util::future::join_all(answers).await.into_iter().map(Result::unwrap).collect::<Vec<_>>();
    answers.sort_by_key(|(request, _)| *request);

    // One more submission, answered once the writer has gone through everything queued before it
    // (one writer, first come first written): after it, nothing of the above is still on its way.
    let (status, body) = submit(&api, SUBMISSIONS).await;
    assert_eq!(status, 201, "{body}");
    let written = written(&api.db.pool).await;

    let mut created = 0;
    let mut refused = Vec::new();
    for (request, (status, body)) in &answers {
        let rows = written.get(request).cloned().unwrap_or_default();
        match status {
            201 => {
                created += 1;
                assert_eq!(rows, [body["id"].as_i64().unwrap()], "submission {request} was answered {body}");
                assert_eq!(body["config"]["request"], *request, "{body}");
            }
            503 => {
                assert_eq!(body["error"]["code"], "request_timeout", "submission {request}: {body}");
                assert!(rows.is_empty(), "submission {request} was answered 503 yet written as {rows:?}: {body}");
                refused.push(*request);
            }
            other => panic!("submission {request} was answered {other}: {body}"),
        }
    }
    assert!(!refused.is_empty(), "no submission waited past the request timeout: the scenario did not happen");
    assert!(created >= 1, "the submission whose insert waited for the lock is answered with its row");
    assert_eq!(written.len() as i64, created + 1, "one execution per 201 (and the last submission's)");

    // clients that were told 503 try again, as told: every request ends with one execution
    for request in refused {
        let (status, body) = submit(&api, request).await;
        assert_eq!(status, 201, "{body}");
    }
    let written = self::written(&api.db.pool).await;
    assert_eq!(written.len() as i64, SUBMISSIONS + 1);
    assert!(written.values().all(|ids| ids.len() == 1), "a request written twice: {written:?}");
    std::sync::Arc::into_inner(api).expect("every request is answered").stop().await;
}

/// A first attempt of `core.noop`, told apart by `config.request`.
fn noop(request: i64) -> NewExecution {
    NewExecution {
        action: None,
        action_ref: "core.noop".into(),
        runtime: Some("builtin".into()),
        parameters: json!({}),
        config: json!({"request": request}),
        // (`ExecutionStatus::Requested`, named as the API names it: this crate does not depend on
        // attune-core)
        status: serde_json::from_value(json!("requested")).unwrap(),
        max_retries: 0,
        timeout_seconds: 300,
        retry_count: 0,
        retry_reason: None,
        original_execution: None,
        not_before: None,
        idempotency_key: None,
        trace_parent: None,
        occurrence: None,
    }
}

/// `postgres://host:port/...` → `host:port`.
fn host_and_port(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let authority = rest.split('/').next().unwrap();
    authority.rsplit_once('@').map_or(authority, |(_, host)| host).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_commit_acknowledgement_was_lost_is_answered_with_its_rows_and_not_written_again() {
    let db = TestDb::new().await;
    let (token, _) = db::token::create_with(&db.pool, "lost-acks", db::token::Role::Admin, None).await.unwrap();
    let token = token.id;
    let cut = PgCut::start(&host_and_port(&db.url)).await;
    // no statement cache: every statement is parsed again, so the trap springs on the next one
    // whose text it names, whatever connection it takes
    let url = format!("{}&statement-cache-capacity=0", cut.url(&db.url));
    let pool = db::connect(&url, 4, Duration::from_secs(10)).await.unwrap();
    let submissions = std::sync::Arc::new(Submissions::start(pool));
    let submit = |request: i64| {
        let submissions = submissions.clone();
        async move {
            submissions
                .submit(noop(request), attune_common::db::execution::Submitter::token(token), Withdrawal::default())
                .await
        }
    };

    // A batch of several: while the first submission's insert waits for the table, five more
    // queue behind it, and go in the next statement together.
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE execution IN ACCESS EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();
    let first = tokio::spawn(submit(0));
    until_an_insert_waits_for_the_lock(&db.pool).await;
    cut.arm("WITH ORDINALITY");
    let mut batch = std::pin::pin!(futures_util::future::join_all((1..=5).map(submit)));
    // one poll queues all five (the queue has room); then the table is let go
    assert!(futures_util::poll!(batch.as_mut()).is_pending());
    lock.rollback().await.unwrap();
    let first = first.await.unwrap().expect("the first submission is written");
    let batch: Vec<_> =
        batch.await.into_iter().map(|written| written.expect("each is answered with its row")).collect();
    assert_eq!(cut.sprung(), 1, "the batch's acknowledgement was lost");

    // A batch of one.
    cut.arm("WITH ORDINALITY");
    let alone = submit(6).await.expect("a lone submission whose acknowledgement was lost is answered with its row");
    assert_eq!(cut.sprung(), 2);

    let written = written(&db.pool).await;
    assert_eq!(written.len(), 7, "{written:?}");
    for (request, execution) in std::iter::once(&first).chain(&batch).chain([&alone]).enumerate() {
        assert_eq!(written[&(request as i64)], [execution.id], "submission {request}: {written:?}");
        assert_eq!(execution.config["request"], request as i64);
    }
    db.drop_database().await;
}
