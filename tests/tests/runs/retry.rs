//! Retries end to end: transient failures become linked, jittered retries; permanent ones do not;
//! the budget is enforced; a backoff survives the executor being killed; a duplicate failure
//! creates no second retry; operators retry by hand through both API forms.

use std::time::Duration;

use attune_testkit::System;
use attune_testkit::system::repo_root;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(90);

async fn system() -> System {
    System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.5")
        .worker("w1", &[])
        .pack(repo_root().join("testkit/packs/e2e"))
        .start()
        .await
}

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

async fn retriable_in_sql(system: &System, id: i64) -> bool {
    sqlx::query_scalar("SELECT is_execution_retriable($1)").bind(id).fetch_one(&system.db.pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_as_a_linked_chain_with_backoff() {
    let system = system().await;
    let first = system.submit("e2e.flaky", json!({"fail_times": 2})).await;
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    let statuses: Vec<&str> = chain.iter().map(|a| a["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["failed", "failed", "completed"], "{chain:#?}");
    for (n, attempt) in chain.iter().enumerate() {
        assert_eq!(attempt["retry_count"], n as i64);
        assert_eq!(attempt["max_retries"], 3, "max_retries is carried from the action");
        if n == 0 {
            assert_eq!(attempt["original_execution"], Value::Null);
            continue;
        }
        assert_eq!(attempt["original_execution"], chain[n - 1]["id"], "linked to the attempt it retries");
        assert_eq!(attempt["retry_reason"], "transient_error");
        assert_eq!(attempt["config"]["retry_reason"], "transient_error");
        assert_eq!(chain[n - 1]["failure_kind"], "transient_error");
        assert_eq!(chain[n - 1]["exit_code"], 75);
        // backoff before retry n is 0.5 s × 2^(n-1), ±20 %; the retry starts soon after it is due
        let nominal = 0.5 * 2f64.powi(n as i32 - 1);
        let backoff = attempt["backoff_secs"].as_f64().unwrap();
        let gap = attempt["gap_secs"].as_f64().unwrap();
        assert!(backoff >= nominal * 0.8 - 0.001 && backoff <= nominal * 1.2 + 0.001, "attempt {n}: backoff {backoff}");
        assert!(gap >= backoff && gap <= backoff + 1.0, "attempt {n}: gap {gap} vs backoff {backoff}");
    }
    assert_eq!(chain[2]["stdout"], "succeeded on attempt 2\n");
    // Seed Example 1, as written but for this chain's first id, returns the same chain.
    let rows: Vec<(i64, i32, Option<String>)> = sqlx::query_as(
        "WITH RECURSIVE retry_chain AS (
SELECT id, retry_count, retry_reason, original_execution, status
FROM execution
WHERE id = $1
UNION ALL
SELECT e.id, e.retry_count, e.retry_reason, e.original_execution, e.status
FROM execution e
JOIN retry_chain rc ON e.original_execution = rc.id
)
SELECT id, retry_count, retry_reason FROM retry_chain ORDER BY retry_count;",
    )
    .bind(id(&first))
    .fetch_all(&system.db.pool)
    .await
    .unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(ids, chain.iter().map(id).collect::<Vec<_>>());
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failures_are_not_retried_and_the_budget_is_enforced() {
    let system = system().await;
    let permanent = system.submit("e2e.flaky", json!({"fail_times": 5, "exit_code": 1})).await;
    let exhausted = system.submit("e2e.flaky", json!({"fail_times": 10})).await;

    let chain = system.wait_chain(id(&permanent), DEADLINE).await;
    assert_eq!(chain.len(), 1, "action_failed is not retried: {chain:#?}");
    assert_eq!(chain[0]["failure_kind"], "action_failed");
    assert!(!retriable_in_sql(&system, id(&chain[0])).await);

    let chain = system.wait_chain(id(&exhausted), DEADLINE).await;
    assert_eq!(chain.len(), 4, "max_retries: 3 means at most 4 attempts: {chain:#?}");
    assert!(chain.iter().all(|a| a["status"] == "failed" && a["failure_kind"] == "transient_error"));
    for attempt in &chain {
        // retried ones have a retry already; the last has no budget left
        assert!(!retriable_in_sql(&system, id(attempt)).await);
    }
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_survives_the_executor_being_killed_during_its_backoff() {
    let mut system = system().await;
    let first = system.submit("e2e.flaky_fixed", json!({"fail_times": 1})).await;
    let pool = system.db.pool.clone();
    let first_id = id(&first);
    attune_testkit::wait_for("the delayed retry", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let status: Option<String> =
                sqlx::query_scalar("SELECT status::text FROM execution WHERE original_execution = $1")
                    .bind(first_id)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
            (status.as_deref() == Some("delayed")).then_some(())
        }
    })
    .await;
    system.signal("executor", 9);
    system.restart("executor");
    let chain = system.wait_chain(first_id, DEADLINE).await;
    assert_eq!(chain.len(), 2, "exactly one retry: {chain:#?}");
    assert_eq!(chain[1]["status"], "completed");
    let backoff = chain[1]["backoff_secs"].as_f64().unwrap();
    assert!((backoff - 10.0).abs() < 0.01, "fixed 10 s backoff without jitter: {backoff}");
    assert!(chain[1]["gap_secs"].as_f64().unwrap() >= 10.0);
    let runs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM execution WHERE original_execution = $1 AND started IS NOT NULL")
            .bind(first_id)
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
    assert_eq!(runs, 1);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicated_failure_message_creates_no_second_retry() {
    let system = system().await;
    let first = system.submit("e2e.flaky", json!({"fail_times": 1})).await;
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.len(), 2);
    let worker = chain[0]["worker"].as_i64().unwrap();
    let duplicate = json!({
        "execution_id": id(&first), "worker_id": worker, "status": "failed", "result": null,
        "failure_kind": "transient_error", "error": "duplicate", "exit_code": 75,
        "stdout": "", "stderr": "", "duration_ms": 1
    });
    system.publish_raw("execution.result", duplicate.to_string().as_bytes()).await;
    system.wait_log("executor", &format!("result is stale or a duplicate execution_id={}", id(&first))).await;
    let retries: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE original_execution = $1")
        .bind(id(&first))
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(retries, 1);
    let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&first))).await;
    assert_eq!(
        view["error"], "the action reported a transient failure (exit code 75)",
        "the duplicate changed nothing: {view}"
    );
    assert_eq!(view["updated"], chain[0]["updated"]);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_says_bad_input_or_no_permission_by_its_exit_code() {
    let system = system().await;
    for (code, kind) in [(65, "validation_error"), (77, "permission_denied"), (2, "action_failed")] {
        let failed = system.submit("core.fail", json!({"exit_code": code, "message": "refused"})).await;
        let chain = system.wait_chain(id(&failed), DEADLINE).await;
        assert_eq!(chain.len(), 1, "exit {code}: {chain:#?}");
        assert_eq!((chain[0]["status"].as_str(), chain[0]["failure_kind"].as_str()), (Some("failed"), Some(kind)));
    }
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_retry_by_hand_through_both_api_forms() {
    let system = system().await;
    let failed = system.submit("core.fail", json!({"exit_code": 2})).await;
    let failed = system.wait_terminal(id(&failed), DEADLINE).await;
    assert_eq!((failed["status"].as_str(), failed["retried_by"].as_i64()), (Some("failed"), None));

    // POST /executions/{id}/retry with changed parameters
    let (status, retry) = system
        .post(&format!("/api/v1/executions/{}/retry", id(&failed)), &json!({"parameters": {"exit_code": 0}}))
        .await;
    assert_eq!(status, 201, "{retry}");
    assert_eq!(retry["original_execution"], id(&failed));
    assert_eq!((retry["retry_count"].as_i64(), retry["retry_reason"].as_str()), (Some(1), Some("manual_retry")));
    assert_eq!(retry["config"]["retry_reason"], "manual_retry");
    assert_eq!(retry["parameters"]["exit_code"], 0);
    let retry = system.wait_terminal(id(&retry), DEADLINE).await;
    assert_eq!(retry["status"], "completed", "{retry}");

    // a second retry of the same execution: 409 naming the existing one
    let (status, body) = system.post(&format!("/api/v1/executions/{}/retry", id(&failed)), &json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "already_retried");
    assert_eq!(body["error"]["retry_execution"], id(&retry));
    assert!(body["error"]["message"].as_str().unwrap().contains(&id(&retry).to_string()));

    // an execution that is still running cannot be retried
    let slow = system.submit("e2e.slow", json!({})).await;
    let (status, body) = system.post(&format!("/api/v1/executions/{}/retry", id(&slow)), &json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("not_terminal")), "{body}");

    // The seed's Example 4, as written: execution 123 is a core.echo that finished.
    sqlx::query("SELECT setval('execution_id_seq', 122)").execute(&system.db.pool).await.unwrap();
    let echo = system.submit("core.echo", json!({"message": "first"})).await;
    assert_eq!(id(&echo), 123);
    system.wait_terminal(123, DEADLINE).await;
    let example4: Value = serde_json::from_str(
        r#"{
"action_ref": "core.echo",
"parameters": {"message": "retry test"},
"config": {
"retry_of": 123,
"retry_count": 1,
"max_retries": 3,
"retry_reason": "manual_retry",
"original_execution": 123
}
}"#,
    )
    .unwrap();
    let (status, created) = system.post("/api/v1/executions", &example4).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["original_execution"], 123);
    assert_eq!((created["retry_count"].as_i64(), created["max_retries"].as_i64()), (Some(1), Some(3)));
    assert_eq!(created["config"]["retry_reason"], "manual_retry");
    let done = system.wait_terminal(id(&created), DEADLINE).await;
    assert_eq!(done["stdout"], "retry test\n");
    let (status, again) = system.post("/api/v1/executions", &example4).await;
    assert_eq!((status, again["error"]["code"].as_str()), (409, Some("already_retried")), "{again}");
    system.stop().await;
}
