//! What SREs read: `/metrics` on the API, executor and workers (each metric moves when the thing
//! it counts happens) and the stats endpoints with the quick reference's alert thresholds.

use std::time::Duration;

use attune_testkit::System;
use attune_testkit::metric_sample as sample;
use attune_testkit::system::repo_root;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn scrape(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// The value of one sample line (`name{labels} value`), 0 when absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_when_what_they_count_happens() {
    let (executor_port, worker_port) = (free_port(), free_port());
    let system = System::builder()
        .env("ATTUNE_METRICS_ADDR", &format!("127.0.0.1:{executor_port}"))
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2")
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.5")
        .env("ATTUNE_WORKER_WAIT_SECS", "0.5")
        .worker("w1", &[("ATTUNE_METRICS_ADDR", &format!("127.0.0.1:{worker_port}"))])
        .pack(repo_root().join("testkit/packs/e2e"))
        .start()
        .await;
    let executor_metrics = format!("http://127.0.0.1:{executor_port}/metrics");
    let worker_metrics = format!("http://127.0.0.1:{worker_port}/metrics");
    let api_metrics = format!("{}/metrics", system.api_url);

    // the executor wrote the retry settings it runs with where SQL and the API read them
    let pool = system.db.pool.clone();
    attune_testkit::wait_for("retry_config to hold the executor's ATTUNE_RETRY_BASE_BACKOFF_SECS", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let base: f64 =
                sqlx::query_scalar("SELECT base_backoff_secs FROM retry_config").fetch_one(&pool).await.ok()?;
            (base == 0.2).then_some(())
        }
    })
    .await;
    let (_, config) = system.get("/api/v1/config").await;
    assert_eq!(config["retry"]["base_backoff_secs"], 0.2, "{config}");

    let before = scrape(&executor_metrics).await;
    assert!(before.contains("# HELP attune_retries_total "), "{before}");
    assert_eq!(sample(&before, "attune_retries_total{reason=\"transient_error\"}"), 0.0);

    let first = system.submit("e2e.flaky", json!({"fail_times": 1})).await;
    let chain = system.wait_chain(first["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(chain.len(), 2);

    // failures are recorded by the executor (its RetryManager), successes by the worker that ran them
    let after = scrape(&executor_metrics).await;
    assert_eq!(sample(&after, "attune_retries_total{reason=\"transient_error\"}"), 1.0, "{after}");
    assert_eq!(sample(&after, "attune_executions_finished_total{status=\"failed\",action=\"e2e.flaky\"}"), 1.0);
    assert_eq!(sample(&after, "attune_executions_finished_total{status=\"completed\",action=\"e2e.flaky\"}"), 0.0);
    assert_eq!(sample(&after, "attune_dispatch_latency_seconds_count"), 2.0);
    assert_eq!(sample(&after, "attune_execution_duration_seconds_count{status=\"failed\"}"), 1.0);

    let worker = scrape(&worker_metrics).await;
    assert_eq!(sample(&worker, "attune_worker_actions_total{runtime=\"shell\",status=\"failed\"}"), 1.0, "{worker}");
    assert_eq!(sample(&worker, "attune_worker_actions_total{runtime=\"shell\",status=\"completed\"}"), 1.0);
    assert_eq!(sample(&worker, "attune_executions_finished_total{status=\"completed\",action=\"e2e.flaky\"}"), 1.0);
    assert_eq!(sample(&worker, "attune_retries_finished_total{result=\"succeeded\"}"), 1.0);
    assert_eq!(sample(&worker, "attune_execution_duration_seconds_count{status=\"completed\"}"), 1.0);

    // A dead letter: counted and parked.
    system.publish_raw("execution.request", b"garbage").await;
    let after = attune_testkit::wait_for("the dead letter to be parked", DEADLINE, || async {
        let text = scrape(&executor_metrics).await;
        (sample(&text, "attune_parked_messages_total") == 1.0).then_some(text)
    })
    .await;
    assert_eq!(sample(&after, "attune_dead_letters_total{reason=\"rejected\"}"), 1.0);
    assert!(system.log("executor").contains("dead letter parked for an operator"));

    // The API's own counters (a manual retry) and the gauges it reads from the record; no token.
    let failed = system.submit("core.fail", json!({})).await;
    system.wait_terminal(failed["id"].as_i64().unwrap(), DEADLINE).await;
    let (status, retry) = system.post(&format!("/api/v1/executions/{}/retry", failed["id"]), &json!({})).await;
    assert_eq!(status, 201);
    // the manual retry of core.fail fails too: wait for it, so that the gauge counts both
    system.wait_terminal(retry["id"].as_i64().unwrap(), DEADLINE).await;
    let api = scrape(&api_metrics).await;
    assert_eq!(sample(&api, "attune_retries_total{reason=\"manual_retry\"}"), 1.0, "{api}");
    // the gauge counts only what is not finished: a scrape never reads history
    assert!(!api.contains("attune_executions{status=\"completed\""), "{api}");
    assert!(!api.contains("attune_executions{status=\"failed\""), "{api}");
    sqlx::query(
        "INSERT INTO execution (action_ref, status, not_before) VALUES ('core.noop', 'delayed', now() + interval '1 day')",
    )
    .execute(&system.db.pool)
    .await
    .unwrap();
    attune_testkit::wait_for("the API's gauge to count the delayed retry", DEADLINE, || async {
        let text = scrape(&api_metrics).await;
        (sample(&text, "attune_executions{status=\"delayed\",action=\"core.noop\"}") == 1.0).then_some(())
    })
    .await;
    assert_eq!(sample(&api, "attune_workers{health=\"healthy\"}"), 1.0);
    assert!(api.contains("attune_worker_queue_depth{worker=\"w1\"}"));
    assert!(!api.contains("execution_id"), "no execution ids in labels");

    // A request nobody published (its hint lost): the schedulers' sweep finds the waiting row.
    let action: i64 =
        sqlx::query_scalar("SELECT id FROM action WHERE ref = 'core.noop'").fetch_one(&system.db.pool).await.unwrap();
    let orphan: i64 = sqlx::query_scalar(
        "INSERT INTO execution (action, action_ref, updated) VALUES ($1, 'core.noop', now() - interval '1 hour') RETURNING id",
    )
    .bind(action)
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(system.wait_terminal(orphan, DEADLINE).await["status"], "completed");
    let after = scrape(&executor_metrics).await;
    assert!(sample(&after, "attune_dispatches_total") >= 1.0, "{after}");
    assert!(!after.contains("kind=\"requeued\""), "nothing is re-published: {after}");

    // No worker with capacity: counted once the wait is over.
    system.force_health("w1", Some(json!({"consecutive_failures": 10})));
    system.wait_worker_health("w1", "unhealthy").await;
    let stranded = system.submit("core.noop", json!({})).await;
    let stranded = system.wait_terminal(stranded["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(stranded["failure_kind"], "worker_unavailable");
    let after = scrape(&executor_metrics).await;
    assert_eq!(sample(&after, "attune_scheduling_no_worker_total{runtime=\"builtin\"}"), 1.0);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_the_key_metrics_and_alert_flags() {
    let system = System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2")
        .worker("w1", &[])
        .worker("w2", &[])
        .pack(repo_root().join("testkit/packs/e2e"))
        .start()
        .await;
    let (status, empty) = system.get("/api/v1/stats/retries").await;
    assert_eq!(status, 200);
    assert_eq!((empty["original_executions"].as_i64(), empty["retry_rate"].is_null()), (Some(0), true), "{empty}");

    // two originals: one needs two retries (both of them transient_error), one none
    let flaky = system.submit("e2e.flaky", json!({"fail_times": 2})).await;
    let plain = system.submit("core.noop", json!({})).await;
    system.wait_chain(flaky["id"].as_i64().unwrap(), DEADLINE).await;
    system.wait_terminal(plain["id"].as_i64().unwrap(), DEADLINE).await;
    let (_, stats) = system.get("/api/v1/stats/retries?window_secs=600").await;
    assert_eq!(stats["original_executions"], 2, "{stats}");
    assert_eq!(stats["retry_executions"], 2);
    assert_eq!(stats["retry_rate"], 100.0);
    assert_eq!(stats["retry_success_rate"], 50.0, "one retry failed, one succeeded");
    assert_eq!(stats["average_retries_per_execution"], 1.0);
    assert_eq!(
        stats["reasons"],
        json!([{"reason": "transient_error", "total": 2, "succeeded": 1, "success_rate": 50.0}])
    );
    assert_eq!(stats["alerts"], json!({"high_retry_rate": true, "low_retry_success_rate": true}));
    let (status, bad) = system.get("/api/v1/stats/retries?window_secs=0").await;
    assert_eq!((status, bad["error"]["parameter"].as_str()), (422, Some("window_secs")));

    let (_, workers) = system.get("/api/v1/stats/workers").await;
    assert_eq!((workers["active_workers"].as_i64(), workers["healthy"].as_i64()), (Some(2), Some(2)), "{workers}");
    assert_eq!(workers["alerts"], json!({"unhealthy_over_half": false, "high_average_queue_depth": false}));
    system.force_health("w1", Some(json!({"consecutive_failures": 12, "queue_depth": 45})));
    system.force_health("w2", Some(json!({"consecutive_failures": 12, "queue_depth": 1})));
    system.wait_worker_health("w1", "unhealthy").await;
    system.wait_worker_health("w2", "unhealthy").await;
    let (_, workers) = system.get("/api/v1/stats/workers").await;
    assert_eq!(workers["unhealthy"], 2, "{workers}");
    assert_eq!(workers["average_queue_depth"], 23.0);
    assert_eq!(workers["alerts"], json!({"unhealthy_over_half": true, "high_average_queue_depth": true}));
    system.stop().await;
}
