//! RabbitMQ goes away in the middle of a stream of 500 executions: the services' connections are
//! force-closed (`rabbitmqctl close_connection`), then the broker application is stopped and
//! started (`rabbitmqctl stop_app` / `start_app`). Every execution still ends, none is lost.
//!
//! It disturbs every user of the broker, so it is ignored by default and run alone:
//! `cargo test -p attune-system-tests --test chaos_broker -- --ignored --test-threads=1` (`make test` does,
//! after the other tests). It needs `rabbitmqctl` with the rights to use it (root here).

use std::process::Command;
use std::time::Duration;

use attune_testkit::System;
use serde_json::json;

fn rabbitmqctl(args: &[&str]) -> String {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("rabbitmqctl {args:?} could not run (needs RabbitMQ's CLI, as root): {e}"));
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Force-closes every connection attune's processes opened (they name their connections).
fn close_attune_connections(namespace_processes: &str) -> usize {
    let listing = rabbitmqctl(&["-q", "list_connections", "pid", "client_properties"]);
    let mut closed = 0;
    for line in listing.lines().filter(|l| l.contains(namespace_processes)) {
        let pid = line.split_whitespace().next().unwrap();
        rabbitmqctl(&["close_connection", pid, "chaos test"]);
        closed += 1;
    }
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the broker: run alone (make test runs it after the other tests)"]
async fn executions_survive_connection_loss_and_a_broker_restart() {
    let system = System::builder()
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.5")
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2")
        .worker("w1", &[])
        .worker("w2", &[])
        .start()
        .await;
    let mut submitted = Vec::new();
    for i in 0..500 {
        if i == 150 {
            let closed = close_attune_connections("attune-");
            assert!(closed >= 5, "closed {closed} connections");
        }
        if i == 300 {
            rabbitmqctl(&["stop_app"]);
            let (status, ready) = system.request(reqwest::Method::GET, "/readyz", None, None).await;
            assert_eq!(status, 503, "not ready while the broker is down: {ready}");
            assert_eq!(ready["database"], "ok");
        }
        if i == 340 {
            rabbitmqctl(&["start_app"]);
            rabbitmqctl(&["await_startup"]);
        }
        submitted.push(system.submit("core.noop", json!({})).await["id"].as_i64().unwrap());
    }
    for first in &submitted {
        let chain = system.wait_chain(*first, Duration::from_secs(240)).await;
        let last = chain.last().unwrap();
        assert_eq!(last["status"], "completed", "{chain:#?}");
    }
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE finished IS NULL")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(open, 0);
    let retried: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE retry_count > 0")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    eprintln!("500 executions through a connection loss and a broker restart; {retried} retries");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the broker: run alone (make test runs it after the other tests)"]
async fn requests_waiting_for_capacity_survive_a_broker_restart_without_failing_or_running_twice() {
    let dir = std::env::temp_dir().join(format!("attune-chaos-{}-{:x}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("runs.log");
    let system = System::builder()
        .pack(attune_testkit::system::repo_root().join("testkit/packs/e2e"))
        .worker("busy", &[("ATTUNE_WORKER_CONCURRENCY", "2")])
        .start()
        .await;
    // 2 running, 4 held ahead by the worker, 40 waiting for its capacity
    let parameters = json!({"log": log.display().to_string(), "seconds": 0.5});
    let mut ids = Vec::new();
    for _ in 0..46 {
        ids.push(system.submit("e2e.record", parameters.clone()).await["id"].as_i64().unwrap());
    }
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE status = 'requested'")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert!(waiting >= 30, "most requests wait for capacity when the broker goes: {waiting}");
    rabbitmqctl(&["stop_app"]);
    tokio::time::sleep(Duration::from_secs(3)).await; // the outage itself, not a synchronisation
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup"]);
    for id in &ids {
        let execution = system.wait_terminal(*id, Duration::from_secs(180)).await;
        assert_eq!(execution["status"], "completed", "{execution}");
    }
    let (count, retries, failed): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE retry_count > 0), count(*) FILTER (WHERE status <> 'completed') \
         FROM execution",
    )
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert_eq!((count, retries, failed), (46, 0, 0), "every execution completed at its first attempt");
    let mut runs = std::collections::BTreeMap::<i64, usize>::new();
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        *runs.entry(line.trim().parse().unwrap()).or_default() += 1;
    }
    assert_eq!(runs.len(), 46, "every execution ran");
    assert!(runs.values().all(|n| *n == 1), "an execution ran twice: {runs:?}");
    let _ = std::fs::remove_dir_all(&dir);
    system.stop().await;
}
