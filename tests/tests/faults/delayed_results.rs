//! A result delayed on its way is recorded as what it is, with the real binaries: while the
//! executor's broker connection is partitioned, failures its workers report cannot reach it; the
//! monitor, which needs only the database, must not pre-empt them as `timeout` (issue 31).

use std::time::Duration;

use attune_testkit::tcpcut::TcpCut;
use attune_testkit::{System, TempPack, amqp_url, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(90);

/// Fails as transient (exit 75) two seconds in on its first attempt; a retry succeeds.
const ONCE: &str = "#!/bin/sh\nsleep 2\n[ \"$ATTUNE_RETRY_COUNT\" -ge 1 ] && exit 0\nexit 75\n";
const ONCE_YAML: &str = "name: once
runtime: shell
entrypoint: actions/once.sh
timeout_seconds: 3
max_retries: 2
";

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_reported_while_the_executor_is_cut_off_from_the_broker_are_recorded_and_retried() {
    let pack = TempPack::new("delayed", &[("once.yaml", ONCE_YAML), ("once.sh", ONCE)]);
    let mut system = System::builder()
        // the overdue sweep would judge these runs 4 s after they start
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.5")
        .env("ATTUNE_MONITOR_GRACE_SECS", "1")
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.1")
        .worker("w", &[("ATTUNE_WORKER_CONCURRENCY", "10")])
        .pack(pack.path())
        .start()
        .await;
    let cut = TcpCut::start("127.0.0.1:5672").await;
    system.restart_with("executor", &[("AMQP_URL", &cut.url(&amqp_url()))]);
    // the executor reaches the broker through the proxy
    let probe = system.submit("core.noop", json!({})).await;
    assert_eq!(system.wait_terminal(id(&probe), DEADLINE).await["status"], "completed");

    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(id(&system.submit("delayed.once", json!({})).await));
    }
    let pool = system.db.pool.clone();
    wait_for("the ten to run", DEADLINE, || {
        let (pool, ids) = (pool.clone(), ids.clone());
        async move {
            let running: i64 =
                sqlx::query_scalar("SELECT count(*) FROM execution WHERE id = ANY($1) AND status = 'running'")
                    .bind(&ids)
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            (running == 10).then_some(())
        }
    })
    .await;
    // their failures (two seconds in) reach the broker, not the executor, for 15 s: far past
    // the runs' deadline (3 s, plus 1 s of grace)
    cut.partition();
    tokio::time::sleep(Duration::from_secs(15)).await;
    cut.heal();

    for first in ids {
        let chain = system.wait_chain(first, DEADLINE).await;
        assert_eq!(chain[0]["failure_kind"], "transient_error", "{chain:#?}");
        assert_eq!(chain.len(), 2, "{chain:#?}");
        assert_eq!(chain[1]["status"], "completed", "{chain:#?}");
    }
    system.stop().await;
}
