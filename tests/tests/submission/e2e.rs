//! End to end: the real `attune-api`, `attune-executor` and `attune-worker` binaries on the real
//! PostgreSQL and RabbitMQ, driven over HTTP as a client would.

use std::time::{Duration, Instant};

use attune_testkit::System;
use attune_testkit::system::repo_root;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

async fn system() -> System {
    System::builder().worker("w1", &[]).pack(repo_root().join("testkit/packs/e2e")).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_fail_python_and_a_timeout_end_as_they_should() {
    let system = system().await;
    let echo = system.submit("core.echo", json!({"message": "hello $(id) world"})).await;
    let fail = system.submit("core.fail", json!({"exit_code": 3, "message": "broken on purpose"})).await;
    let python = system.submit("core.python_echo", json!({"message": "hi", "repeat": 2})).await;
    let slow_submitted = Instant::now();
    let slow = system.submit("e2e.slow", json!({})).await;
    for execution in [&echo, &fail, &python, &slow] {
        assert_eq!(execution["status"], "requested", "{execution}");
        assert_eq!(execution["retry_count"], 0);
    }

    let echo = system.wait_terminal(echo["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(echo["status"], "completed", "{echo}");
    assert_eq!(echo["exit_code"], 0);
    assert_eq!(echo["stdout"], "hello $(id) world\n", "parameters reach the script as data");
    assert_eq!(echo["failure_kind"], Value::Null);
    assert!(echo["worker"].is_i64());

    let fail = system.wait_terminal(fail["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(fail["status"], "failed", "{fail}");
    assert_eq!(fail["exit_code"], 3);
    assert_eq!(fail["failure_kind"], "action_failed");
    assert_eq!(fail["stderr"], "broken on purpose\n");

    let python = system.wait_terminal(python["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(python["status"], "completed", "{python}");
    assert_eq!(python["result"], json!({"echo": "hi hi"}));

    let slow = system.wait_terminal(slow["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(slow["status"], "timeout", "{slow}");
    assert_eq!(slow["failure_kind"], "timeout");
    assert_eq!(slow["stdout"], "started\n");
    assert!(slow_submitted.elapsed() < Duration::from_secs(20), "the 1 s timeout was enforced");

    // The record agrees with the API, and finished is set exactly for terminal rows.
    let unfinished: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE finished IS NULL")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(unfinished, 0);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_submissions_get_a_4xx_naming_the_problem() {
    let system = system().await;
    let cases = [
        (json!({"action_ref": "core.echo", "parameters": {}}), 422, "parameters.message", "is required"),
        (
            json!({"action_ref": "core.echo", "parameters": {"message": 5}}),
            422,
            "parameters.message",
            "expected string",
        ),
        (
            json!({"action_ref": "core.echo", "parameters": {"message": "x", "colour": 1}}),
            422,
            "parameters.colour",
            "unknown parameter",
        ),
        (json!({"action_ref": "core.echo", "parameters": "message=x"}), 422, "parameters", "must be a JSON object"),
        (json!({"parameters": {}}), 422, "action_ref", "missing field"),
        (json!({"action_ref": "core.nope"}), 404, "", "does not exist"),
    ];
    for (body, status, parameter, message) in cases {
        let (got, response) = system.post("/api/v1/executions", &body).await;
        assert_eq!(got, status, "{body}: {response}");
        let error = &response["error"];
        assert!(error["message"].as_str().unwrap().contains(message), "{body}: {response}");
        if !parameter.is_empty() {
            assert_eq!(error["parameter"], parameter, "{body}: {response}");
        }
    }
    // Nothing was queued for any of them.
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(&system.db.pool).await.unwrap();
    assert_eq!(count, 0);

    // No token, a wrong token: 401 with the error shape; health and readiness need none.
    let (status, body) = system.request(reqwest::Method::GET, "/api/v1/executions", None, None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")), "{body}");
    let (status, _) = system.request(reqwest::Method::GET, "/api/v1/executions", None, Some("attune_wrong")).await;
    assert_eq!(status, 401);
    let (status, _) = system.request(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(status, 200);
    system.stop().await;
}
