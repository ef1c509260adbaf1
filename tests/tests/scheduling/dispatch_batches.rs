//! One dispatch message names every execution a scheduling claim placed on a worker
//! (`Dispatch::more`), with the real binaries: the worker runs each of them, and when such a
//! message expires in the queue of a worker that takes nothing, each of its executions fails as
//! `queue_timeout` and is retried elsewhere, as if it had had a message of its own.

use std::time::Duration;

use attune_testkit::system::repo_root;
use attune_testkit::{System, close_broker_connections, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(90);
const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// Submits `n` executions of `action_ref` with nobody scheduling them, then marks them scheduled
/// on `worker_id` as a scheduler's claim would: the dispatch the test publishes is their only one.
async fn scheduled_on(system: &System, worker_id: i64, action_ref: &str, params: &[Value]) -> Vec<i64> {
    let mut ids = Vec::new();
    for p in params {
        ids.push(id(&system.submit(action_ref, p.clone()).await));
    }
    let marked = sqlx::query(
        "UPDATE execution SET status = 'scheduled', worker = $2, updated = now() \
         WHERE id = ANY($1) AND status = 'requested'",
    )
    .bind(&ids)
    .bind(worker_id)
    .execute(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(marked.rows_affected(), ids.len() as u64);
    ids
}

fn dispatch_of(worker_id: i64, ids: &[i64]) -> Vec<u8> {
    json!({"execution_id": ids[0], "worker_id": worker_id, "more": ids[1..]}).to_string().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_every_execution_one_dispatch_message_names() {
    let mut system = System::builder().worker("w1", &[]).start().await;
    // nobody schedules: the test's message is the only dispatch
    system.signal("executor", SIGKILL);
    let w1 = system.worker_id("w1").await;
    let params: Vec<Value> = (0..3).map(|n| json!({"message": format!("batch-{n}")})).collect();
    let ids = scheduled_on(&system, w1, "core.echo", &params).await;
    system.publish_raw(&format!("worker.{w1}"), &dispatch_of(w1, &ids)).await;
    for (n, execution) in ids.iter().enumerate() {
        let done = system.wait_terminal(*execution, DEADLINE).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["worker"], w1, "{done}");
        assert!(done["stdout"].as_str().unwrap_or_default().contains(&format!("batch-{n}")), "{done}");
    }
    // each ran once: one claim per execution
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE id = ANY($1) AND run_token IS NOT NULL")
        .bind(&ids)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(claims, 3);
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(&system.db.pool).await.unwrap();
    assert_eq!(total, 3, "no retry rows");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_execution_of_an_expired_dispatch_message_fails_as_queue_timeout_and_is_retried() {
    let mut system = System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2")
        .env("ATTUNE_WORKER_QUEUE_TTL_SECS", "3")
        .env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "30")
        .pack(repo_root().join("testkit/packs/e2e"))
        .worker("frozen", &[])
        .start()
        .await;
    system.signal("executor", SIGKILL);
    let frozen = system.worker_id("frozen").await;
    let params: Vec<Value> = (0..3).map(|_| json!({"fail_times": 0})).collect();
    let ids = scheduled_on(&system, frozen, "e2e.flaky", &params).await;
    // the worker takes nothing from its queue: frozen, its consumer's connection closed
    system.signal("frozen", SIGSTOP);
    assert_eq!(close_broker_connections("attune-worker-frozen-consumer"), 1, "the frozen worker's consumer");
    system.publish_raw(&format!("worker.{frozen}"), &dispatch_of(frozen, &ids)).await;
    // the message expires after 3 s; the executor's DLQ handler takes it, and the retries run on w2
    system.restart("executor");
    system.restart("w2");
    for first in &ids {
        let chain = system.wait_chain(*first, DEADLINE).await;
        assert_eq!(chain.len(), 2, "{chain:#?}");
        assert_eq!(chain[0]["failure_kind"], "queue_timeout", "{chain:#?}");
        assert_eq!(chain[0]["worker"], frozen, "{chain:#?}");
        assert_eq!(chain[1]["status"], "completed", "{chain:#?}");
        assert_ne!(chain[1]["worker"], frozen, "{chain:#?}");
    }
    wait_for("the expiry logged for each execution", DEADLINE, || async {
        (system.log("executor").matches("dispatch expired in the worker queue").count() == 3).then_some(())
    })
    .await;
    system.signal("frozen", SIGCONT);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_several_past_its_delivery_limit_hands_back_the_unstarted_and_leaves_the_running() {
    // A message naming several executions comes back on every reconnect while one of them waits
    // for a slot, so its delivery count says nothing about a sibling that runs: only the unstarted
    // one goes back to waiting, the running one is not failed as poison.
    let mut system = System::builder().worker("w1", &[]).start().await;
    let w1 = system.worker_id("w1").await;
    let running = id(&system.submit("core.sleep", json!({"seconds": 6})).await);
    wait_for("the sleep to run", DEADLINE, || async {
        let status: String = sqlx::query_scalar("SELECT status::text FROM execution WHERE id = $1")
            .bind(running)
            .fetch_one(&system.db.pool)
            .await
            .ok()?;
        (status == "running").then_some(())
    })
    .await;
    // nobody schedules or handles dead letters until the forged one is in the dead-letter queue
    system.signal("executor", SIGKILL);
    let unstarted = scheduled_on(&system, w1, "core.echo", &[json!({"message": "handed back"})]).await[0];
    let queue = format!("{}.worker.{w1}", system.namespace.name);
    system
        .publish_dead_letter(&format!("worker.{w1}"), &dispatch_of(w1, &[running, unstarted]), "delivery_limit", &queue)
        .await;
    system.restart("executor");
    system
        .wait_log(
            "executor",
            &format!("dead-lettered dispatch had not started; the execution waits again execution_id={unstarted}"),
        )
        .await;
    let slept = system.wait_terminal(running, DEADLINE).await;
    assert_eq!(slept["status"], "completed", "the running one went on: {slept}");
    let echoed = system.wait_terminal(unstarted, DEADLINE).await;
    assert_eq!(echoed["status"], "completed", "{echoed}");
    assert!(!system.log("executor").contains("poison message"), "nothing was failed as poison");
    system.stop().await;
}
