//! The quick reference's troubleshooting section, one test per problem, each resolution step as
//! the book's "Troubleshooting" chapter shows it (the seed's own statement where it gives one) checked
//! to tell the truth.

use std::time::Duration;

use attune_testkit::system::repo_root;
use attune_testkit::{System, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);
const SIGKILL: i32 = 9;

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// `attune <args>` against the system: stdout, or a panic with stderr.
fn attune(system: &System, args: &[&str]) -> String {
    system.cli(args)
}

fn fast_retries() -> attune_testkit::SystemBuilder {
    System::builder().env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.1").pack(repo_root().join("testkit/packs/e2e"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_retry_rate() {
    let system = fast_retries().worker("w1", &[]).start().await;
    for _ in 0..3 {
        let first = system.submit("core.flaky", json!({"fail_times": 1})).await;
        system.wait_chain(id(&first), DEADLINE).await;
    }
    // "Check worker stability": the workers, their health and heartbeat age
    let workers = attune(&system, &["worker", "list"]);
    assert!(workers.lines().any(|l| l.contains("w1") && l.contains("active") && l.contains("healthy")), "{workers}");
    // "Investigate root cause of failures": retries by reason, and the rate that alerts
    let (_, stats) = system.get("/api/v1/stats/retries").await;
    assert_eq!(stats["reasons"][0]["reason"], "transient_error", "{stats}");
    assert_eq!((stats["original_executions"].as_i64(), stats["retry_executions"].as_i64()), (Some(3), Some(3)));
    assert_eq!(stats["alerts"]["high_retry_rate"], true, "{stats}");
    // "Review action idempotency": the policy an execution ran under says it
    let failed: i64 = sqlx::query_scalar("SELECT min(id) FROM execution WHERE status = 'failed'")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    let told = attune(&system, &["execution", "explain", &failed.to_string()]);
    assert!(told.contains("idempotent: true") && told.contains("decision: retried"), "{told}");
    // "Adjust max_retries if retries are unhelpful": change the YAML, register the pack again
    let pack = system.packs_dir().join("core");
    let yaml = pack.join("actions/flaky.yaml");
    let text = std::fs::read_to_string(&yaml).unwrap().replace("max_retries: 3", "max_retries: 1");
    std::fs::write(&yaml, text).unwrap();
    attune(&system, &["pack", "register", pack.to_str().unwrap()]);
    let max: i32 = sqlx::query_scalar("SELECT max_retries FROM action WHERE ref = 'core.flaky'")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(max, 1);
    let next = system.submit("core.flaky", json!({"fail_times": 5})).await;
    let chain = system.wait_chain(id(&next), DEADLINE).await;
    assert_eq!(chain.len(), 2, "one retry at most now: {chain:#?}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_not_triggering() {
    let system = fast_retries().env("ATTUNE_RETRY_ENABLED", "false").worker("w1", &[]).start().await;
    // "Check action configuration", as the seed writes it
    let (timeout, max): (Option<i32>, Option<i32>) =
        sqlx::query_as("SELECT timeout_seconds, max_retries FROM action WHERE ref = 'core.fail'")
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
    // no timeout of its own (ATTUNE_DEFAULT_TIMEOUT_SECS applies) and no retries: the cause
    assert_eq!((timeout, max), (None, Some(0)), "core.fail declares no retries");
    // "Check failure message for retriable patterns": the decision says which rule held
    let failed = system.submit("core.fail", json!({})).await;
    system.wait_chain(id(&failed), DEADLINE).await;
    let told = attune(&system, &["execution", "explain", &id(&failed).to_string()]);
    assert!(told.contains("rule: disabled") || told.contains("rule: kind_not_retried"), "{told}");
    // "Verify retry enabled in executor config": here it is not, and everything says so
    let config = attune(&system, &["config"]);
    assert!(config.starts_with("retry   enabled false"), "{config}");
    let enabled: bool =
        sqlx::query_scalar("SELECT enabled FROM retry_config").fetch_one(&system.db.pool).await.unwrap();
    assert!(!enabled);
    let flaky = system.submit("core.flaky", json!({"fail_times": 1})).await;
    let chain = system.wait_chain(id(&flaky), DEADLINE).await;
    assert_eq!(chain.len(), 1, "retries are off: {chain:#?}");
    assert_eq!(chain[0]["retry_decision"]["rule"], "disabled", "{chain:#?}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_marked_unhealthy() {
    let mut system = fast_retries().worker("w1", &[]).start().await;
    // "Check worker logs"
    system.wait_log("w1", "worker registered").await;
    // "Verify heartbeat", as the seed writes it
    let rows: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> =
        sqlx::query_as("SELECT name, last_heartbeat FROM worker;").fetch_all(&system.db.pool).await.unwrap();
    let age = chrono::Utc::now() - rows.iter().find(|(n, _)| n == "w1").unwrap().1.unwrap();
    assert!(age < chrono::Duration::seconds(5), "a live worker's heartbeat is fresh: {age}");
    // "Check queue depth in capabilities": what it reports, and what the scheduler counts
    let hold = std::env::temp_dir().join(format!("attune-trouble-hold-{:08x}", rand::random::<u32>()));
    let held = system.submit("e2e.hold", json!({"pidfile": hold})).await;
    let pool = system.db.pool.clone();
    let (reported, counted): (Option<String>, i32) = wait_for("the worker to report its queue", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let row: (Option<String>, i32) = sqlx::query_as(
                "SELECT capabilities->'health'->>'queue_depth', get_worker_queue_depth(id) FROM worker WHERE name = 'w1'",
            )
            .fetch_one(&pool)
            .await
            .ok()?;
            (row.0.as_deref() == Some("1")).then_some(row)
        }
    })
    .await;
    assert_eq!((reported.as_deref(), counted), (Some("1"), 1));
    attune(&system, &["execution", "cancel", &id(&held).to_string()]);
    // "Restart worker if stuck": a killed worker started again takes its name back at once
    system.signal("w1", SIGKILL);
    system.restart("w1");
    system.wait_worker_health("w1", "healthy").await;
    let done = system.submit("core.echo", json!({"message": "back"})).await;
    assert_eq!(system.wait_terminal(id(&done), DEADLINE).await["status"], "completed");
    let _ = std::fs::remove_file(&hold);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_loops() {
    let system = fast_retries().worker("w1", &[]).start().await;
    // "Check retry chain": max_retries is enforced, the last attempt says so
    let first = system.submit("core.flaky", json!({"fail_times": 10})).await;
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.len(), 4, "max_retries 3: four attempts: {chain:#?}");
    let last = chain.last().unwrap();
    assert_eq!(last["retry_decision"]["rule"], "exhausted", "{last}");
    // "Verify max_retries", as the seed writes it (for the last attempt)
    let config: Value =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT config FROM execution WHERE id = {};", id(last))))
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
    assert_eq!((config["max_retries"].as_i64(), config["retry_count"].as_i64()), (Some(3), Some(3)), "{config}");
    // "Fix retry reason classification if incorrect": the reason each retry was made for
    for attempt in &chain[1..] {
        assert_eq!(attempt["retry_reason"], "transient_error");
    }
    // "Manually fail execution if stuck"
    let pidfile = std::env::temp_dir().join(format!("attune-trouble-stuck-{:08x}", rand::random::<u32>()));
    let stuck = system.submit("e2e.hold", json!({"pidfile": pidfile})).await;
    wait_for("the stuck one to run", DEADLINE, || async { pidfile.exists().then_some(()) }).await;
    let said = attune(&system, &["execution", "fail", &id(&stuck).to_string(), "--reason", "stuck in a loop"]);
    assert!(said.contains("failed (failed by an operator: stuck in a loop)"), "{said}");
    let view = system.wait_terminal(id(&stuck), DEADLINE).await;
    assert_eq!(view["failure_kind"], "operator_failed");
    let _ = std::fs::remove_file(&pidfile);
    system.stop().await;
}
