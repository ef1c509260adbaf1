//! Defense in depth with the real binaries: dead workers, expired queues, poison messages,
//! database connections cut mid-stream, cancellation. Every test checks that every submitted
//! execution ends in a terminal state and that nothing ran twice unless a retry row records it.

use std::time::Duration;

use attune_testkit::system::repo_root;
use attune_testkit::{System, close_broker_connections, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);
const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

fn fast_recovery() -> attune_testkit::SystemBuilder {
    System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2")
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.5")
        .pack(repo_root().join("testkit/packs/e2e"))
}

/// Every execution ran at most once (a row is claimed once), and every attempt after the first
/// is a retry row linked to the attempt before it.
async fn assert_no_silent_reruns(system: &System) {
    let unlinked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM execution e WHERE e.retry_count > 0 AND NOT EXISTS \
         (SELECT 1 FROM execution p WHERE p.id = e.original_execution AND p.retry_count = e.retry_count - 1)",
    )
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(unlinked, 0, "every retry is linked to the attempt it retries");
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE finished IS NULL")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(open, 0, "every execution ended in a terminal state");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_executions_are_retried_on_another_worker() {
    let mut system =
        fast_recovery().env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "3").worker("w1", &[]).worker("w2", &[]).start().await;
    let w1 = system.worker_id("w1").await;
    let mut submitted = Vec::new();
    for _ in 0..6 {
        submitted.push(id(&system.submit("e2e.work", json!({"seconds": 3})).await));
    }
    system.wait_count_on("executions running on w1", w1, &["running"], |n| n > 0).await;
    system.signal("w1", SIGKILL);
    for first in &submitted {
        let chain = system.wait_chain(*first, DEADLINE).await;
        let last = chain.last().unwrap();
        assert_eq!(last["status"], "completed", "{chain:#?}");
        for attempt in &chain[..chain.len() - 1] {
            assert_eq!(attempt["worker"], w1, "only attempts on the killed worker were retried: {chain:#?}");
            // running when it died: heartbeat stale; dispatched but not started: unavailable
            let expected = if attempt["started"].is_null() { "worker_unavailable" } else { "worker_heartbeat_stale" };
            assert_eq!(attempt["failure_kind"], expected, "{chain:#?}");
        }
    }
    let retried: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE retry_count > 0")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert!(retried > 0);
    assert_no_silent_reruns(&system).await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_expiring_in_an_unreachable_workers_queue_flows_through_the_dead_letter_queue() {
    // The worker is frozen and its broker connection closed: it heartbeated a moment ago, so the
    // executor still dispatches to it, but nothing consumes its queue. The dispatches expire
    // after 3 s and come back through the dead-letter queue (the seed's Phase 2); the expiry
    // marks the worker as not consuming (not inactive: its heartbeat is fresh), so the retries
    // go to another worker.
    let mut system = fast_recovery()
        .env("ATTUNE_WORKER_QUEUE_TTL_SECS", "3")
        .env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "10")
        // concurrency 4: its slots (4 + a look-ahead of 4 before anything is timed) take all four
        .worker("dlq-unreachable", &[("ATTUNE_WORKER_CONCURRENCY", "4")])
        .start()
        .await;
    let unreachable = system.worker_id("dlq-unreachable").await;
    system.signal("dlq-unreachable", SIGSTOP);
    let closed = close_broker_connections("attune-worker-dlq-unreachable-consumer");
    assert_eq!(closed, 1, "the frozen worker's consumer connection");
    let mut submitted = Vec::new();
    for _ in 0..4 {
        submitted.push(id(&system.submit("e2e.flaky", json!({"fail_times": 0})).await));
    }
    system.restart("w2");
    let mut expired = 0;
    for first in &submitted {
        let chain = system.wait_chain(*first, DEADLINE).await;
        let last = chain.last().unwrap();
        assert_eq!(last["status"], "completed", "{chain:#?}");
        assert_ne!(last["worker"], unreachable);
        for attempt in &chain[..chain.len() - 1] {
            assert_eq!(attempt["failure_kind"], "queue_timeout", "{chain:#?}");
            assert_eq!(attempt["worker"], unreachable);
        }
        expired += usize::from(chain.len() > 1);
    }
    assert!(expired >= 3, "the queued dispatches expired through the DLQ ({expired} of 4)");
    assert!(system.log("executor").contains("dispatch expired in the worker queue"));
    system.signal("dlq-unreachable", SIGCONT);
    assert_no_silent_reruns(&system).await;
    system.stop().await;
}

/// Force-closes the broker connections whose client properties mention `name` (needs
/// `rabbitmqctl`, as root); returns how many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_after_its_delivery_limit() {
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let system = fast_recovery()
        .env("ATTUNE_METRICS_ADDR", &format!("127.0.0.1:{metrics_port}"))
        .worker("w1", &[("ATTUNE_METRICS_ADDR", "")])
        .start()
        .await;
    // Every scheduling write of this one execution fails inside the database, as a bug would:
    // the batch claim that includes it is refused, the others are claimed one by one, and it
    // fails as poison after the delivery limit's number of refusals.
    sqlx::raw_sql(
        "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.status IN ('scheduling', 'scheduled') AND NEW.parameters->>'message' = 'poison' THEN \
             RAISE EXCEPTION 'this execution cannot be scheduled'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER poison BEFORE UPDATE ON execution FOR EACH ROW EXECUTE FUNCTION poison();",
    )
    .execute(&system.db.pool)
    .await
    .unwrap();
    let poisoned = system.submit("core.echo", json!({"message": "poison"})).await;
    let healthy = system.submit("core.echo", json!({"message": "fine"})).await;
    let poisoned = system.wait_terminal(id(&poisoned), DEADLINE).await;
    assert_eq!(poisoned["status"], "failed", "{poisoned}");
    assert_eq!(poisoned["failure_kind"], "poison_message");
    assert!(poisoned["error"].as_str().unwrap().contains("scheduling write failed 5 times"), "{poisoned}");
    assert_eq!(system.wait_terminal(id(&healthy), DEADLINE).await["status"], "completed");
    let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "attune_poison_messages_total 1"), "{metrics}");
    let attempts = system.log("executor").matches("the database refused to schedule this execution").count();
    assert_eq!(attempts as i64, attune_common::mq::DELIVERY_LIMIT, "bounded attempts, not forever");

    // An unparseable message is dead-lettered at once and parked, with its content logged.
    system.publish_raw("execution.request", b"{not json").await;
    system.wait_log("executor", "dead letter parked for an operator").await;
    assert!(system.log("executor").contains("{not json"));
    assert_no_silent_reruns(&system).await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_survive_their_database_connections_being_terminated() {
    let system = fast_recovery().worker("w1", &[]).worker("w2", &[]).start().await;
    let admin = sqlx::PgPool::connect(&attune_testkit::admin_database_url()).await.unwrap();
    let mut submitted = Vec::new();
    for i in 0..150 {
        submitted.push(id(&system.submit("core.noop", json!({})).await));
        if i % 50 == 25 {
            let killed: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() \
                 AND application_name NOT LIKE 'test%'",
            )
            .bind(&system.db.name)
            .fetch_all(&admin)
            .await
            .unwrap();
            assert!(!killed.is_empty());
        }
    }
    for first in &submitted {
        let chain = system.wait_chain(*first, DEADLINE).await;
        assert_eq!(chain.last().unwrap()["status"], "completed", "{chain:#?}");
    }
    assert_no_silent_reruns(&system).await;
    system.stop().await;
}

/// The pid an `e2e.hold` run writes to its pidfile once it runs.
async fn started_pid(pidfile: &std::path::Path) -> i32 {
    wait_for(
        "the action to start",
        DEADLINE,
        || async move { std::fs::read_to_string(pidfile).ok()?.trim().parse().ok() },
    )
    .await
}

/// Waits until the process is gone (or a zombie).
async fn killed(pid: i32) {
    wait_for("the action's process to be killed", DEADLINE, || async move {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        (stat.is_empty() || stat.contains(") Z")).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_queued_and_running_executions() {
    let mut system = fast_recovery().worker("w1", &[]).start().await;

    // running: its process is killed, and it is not retried
    let pidfile = std::env::temp_dir().join(format!("attune-hold-{}", std::process::id()));
    let running = system.submit("e2e.hold", json!({"pidfile": pidfile})).await;
    let pid = started_pid(&pidfile).await;
    let (status, canceled) = system.post(&format!("/api/v1/executions/{}/cancel", id(&running)), &json!({})).await;
    assert_eq!((status, canceled["status"].as_str()), (200, Some("canceled")), "{canceled}");
    killed(pid).await;
    system.wait_log("w1", "stopped while running (canceled or failed by hand); process group killed").await;

    // failed by hand while running (the quick reference's "manually fail execution if stuck"):
    // its process is killed the same way, and it is not retried
    let failed_pidfile = std::env::temp_dir().join(format!("attune-hold-failed-{}", std::process::id()));
    let stuck = system.submit("e2e.hold", json!({"pidfile": failed_pidfile})).await;
    let pid = started_pid(&failed_pidfile).await;
    let (status, failed) =
        system.post(&format!("/api/v1/executions/{}/fail", id(&stuck)), &json!({"reason": "stuck"})).await;
    assert_eq!((status, failed["failure_kind"].as_str()), (200, Some("operator_failed")), "{failed}");
    killed(pid).await;

    // queued: it never runs
    system.signal("w1", SIGSTOP);
    let queued = system.submit("core.echo", json!({"message": "never"})).await;
    let pool = system.db.pool.clone();
    wait_for("the execution to be queued on the worker", DEADLINE, || {
        let pool = pool.clone();
        let queued = id(&queued);
        async move {
            let status: String = sqlx::query_scalar("SELECT status::text FROM execution WHERE id = $1")
                .bind(queued)
                .fetch_one(&pool)
                .await
                .ok()?;
            (status == "scheduled").then_some(())
        }
    })
    .await;
    let (status, canceled) = system.post(&format!("/api/v1/executions/{}/cancel", id(&queued)), &json!({})).await;
    assert_eq!((status, canceled["status"].as_str()), (200, Some("canceled")), "{canceled}");
    system.signal("w1", SIGCONT);
    system.wait_log("w1", &format!("dispatch is stale or a duplicate execution_id={}", id(&queued))).await;

    // a finished execution cannot be canceled; canceled ones were not retried
    let (status, body) = system.post(&format!("/api/v1/executions/{}/cancel", id(&queued)), &json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("already_finished")));
    let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&stuck))).await;
    assert_eq!((view["status"].as_str(), view["retried_by"].as_i64()), (Some("failed"), None), "{view}");
    let _ = std::fs::remove_file(&failed_pidfile);
    for execution in [&running, &queued] {
        let (_, view) = system.get(&format!("/api/v1/executions/{}", id(execution))).await;
        assert_eq!((view["status"].as_str(), view["retried_by"].as_i64()), (Some("canceled"), None), "{view}");
        if execution == &queued {
            assert_eq!(view["started"], Value::Null, "a canceled queued execution never ran");
        }
    }
    let _ = std::fs::remove_file(&pidfile);
    assert_no_silent_reruns(&system).await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_queue_ttl_moves_the_worker_to_a_new_queue() {
    let mut system = fast_recovery().worker("w1", &[]).start().await;
    let queue = |system: &System| {
        let pool = system.db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT capabilities->>'queue' FROM worker WHERE name = 'w1'")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let old = queue(&system).await;
    assert!(old.ends_with(".ttl300.q2"), "{old}");
    system.signal("w1", 15);
    system.restart_with("w1", &[("ATTUNE_WORKER_QUEUE_TTL_SECS", "120")]);
    let pool = system.db.pool.clone();
    wait_for("w1 on its new queue", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let (queue, status): (String, String) =
                sqlx::query_as("SELECT capabilities->>'queue', status FROM worker WHERE name = 'w1'")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            (queue.ends_with(".ttl120.q2") && status == "active").then_some(())
        }
    })
    .await;
    assert!(system.log("w1").contains("the worker queue TTL changed"));
    // the old, empty queue is gone (a passive declare of it fails) and work flows on the new one
    let connection = attune_common::mq::connect(&attune_testkit::amqp_url(), "ttl-test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
    assert!(
        channel.queue_declare(old.as_str().into(), passive, Default::default()).await.is_err(),
        "{old} still exists"
    );
    let _ = connection.close(200, "done".into()).await;
    let done = system.submit("core.noop", json!({})).await;
    assert_eq!(system.wait_terminal(id(&done), DEADLINE).await["status"], "completed");
    system.stop().await;
}
