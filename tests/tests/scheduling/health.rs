//! Health-aware scheduling with real workers whose reported health is forced through
//! `ATTUNE_WORKER_HEALTH_OVERRIDE_FILE`.

use std::collections::BTreeMap;
use std::time::Duration;

use attune_testkit::{System, metric_sample};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

async fn run_noop(system: &System) -> Value {
    let submitted = system.submit("core.noop", json!({})).await;
    system.wait_terminal(submitted["id"].as_i64().unwrap(), DEADLINE).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_example_selects_a_then_b_then_c_and_never_d() {
    // with every worker unhealthy a request waits this long for one before it fails
    let mut builder = System::builder().env("ATTUNE_WORKER_WAIT_SECS", "1");
    for name in ["a", "b", "c", "d"] {
        builder = builder.worker(name, &[]);
    }
    let system = builder.start().await;
    let forced = [
        ("a", json!({"queue_depth": 5}), "healthy"),
        ("b", json!({"queue_depth": 20}), "healthy"),
        ("c", json!({"consecutive_failures": 3, "queue_depth": 10}), "degraded"),
        ("d", json!({"consecutive_failures": 10, "queue_depth": 0}), "unhealthy"),
    ];
    for (name, fields, _) in &forced {
        system.force_health(name, Some(fields.clone()));
    }
    for (name, fields, class) in &forced {
        let worker = system.wait_worker_reports(name, fields).await;
        assert_eq!(worker["health"], *class, "{worker}");
    }
    let ids: BTreeMap<&str, i64> = {
        let mut ids = BTreeMap::new();
        for name in ["a", "b", "c", "d"] {
            ids.insert(name, system.worker_id(name).await);
        }
        ids
    };
    // A first; with A out of the way B; then C (degraded); never D.
    for expected in ["a", "b", "c"] {
        for _ in 0..3 {
            let execution = run_noop(&system).await;
            assert_eq!(execution["status"], "completed", "{execution}");
            assert_eq!(execution["worker"], ids[expected], "expected worker {expected}: {execution}");
        }
        system.force_health(expected, Some(json!({"consecutive_failures": 10})));
        system.wait_worker_health(expected, "unhealthy").await;
    }
    let execution = run_noop(&system).await;
    assert_eq!(execution["status"], "failed", "{execution}");
    assert_eq!(execution["failure_kind"], "worker_unavailable");
    assert_eq!(execution["worker"], Value::Null, "unhealthy D was never chosen");
    assert_eq!(system.count_on(ids["d"], &[]).await, 0);
    system.stop().await;
}

async fn per_worker(system: &System, ids: &[i64]) -> Vec<i64> {
    let mut counts = Vec::new();
    for id in ids {
        counts.push(system.count_on(*id, &[]).await);
    }
    counts
}

async fn burst(system: &System, count: usize, action: &str, parameters: Value) {
    // 25 concurrent clients: many scheduling decisions are in flight at once
    let mut ids = Vec::new();
    for chunk in (0..count).collect::<Vec<_>>().chunks(25) {
        let submissions = chunk.iter().map(|_| system.submit(action, parameters.clone()));
        ids.extend(futures_util::future::join_all(submissions).await.iter().map(|e| e["id"].as_i64().unwrap()));
    }
    for id in ids {
        let execution = system.wait_terminal(id, DEADLINE).await;
        assert_eq!(execution["status"], "completed", "{execution}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spreads_evenly_and_an_unhealthy_worker_gets_nothing_until_it_recovers() {
    let concurrency = [("ATTUNE_WORKER_CONCURRENCY", "100")];
    let system = System::builder()
        .worker("w1", &concurrency)
        .worker("w2", &concurrency)
        .worker("w3", &concurrency)
        .start()
        .await;
    let ids = [system.worker_id("w1").await, system.worker_id("w2").await, system.worker_id("w3").await];

    // 200 executions that stay in flight while the burst is scheduled.
    burst(&system, 200, "core.sleep", json!({"seconds": 3})).await;
    let counts = per_worker(&system, &ids).await;
    eprintln!("burst of 200 over 3 workers: {counts:?}");
    assert_eq!(counts.iter().sum::<i64>(), 200);
    for count in &counts {
        assert!((53..=80).contains(count), "200 over 3 workers should be within ±20 % of even: {counts:?}");
    }

    system.force_health("w3", Some(json!({"consecutive_failures": 10})));
    system.wait_worker_health("w3", "unhealthy").await;
    burst(&system, 30, "core.sleep", json!({"seconds": 0.5})).await;
    let after_unhealthy = per_worker(&system, &ids).await;
    assert_eq!(after_unhealthy[2], counts[2], "an unhealthy worker receives nothing new: {after_unhealthy:?}");

    system.force_health("w3", None);
    system.wait_worker_health("w3", "healthy").await;
    burst(&system, 30, "core.sleep", json!({"seconds": 0.5})).await;
    let recovered = per_worker(&system, &ids).await;
    assert!(recovered[2] >= after_unhealthy[2] + 5, "a recovered worker receives work again: {recovered:?}");
    system.stop().await;
}

/// `count` runs of `e2e.gate` submitted at once behind a new, closed gate: the gate, the runs' ids
/// and the slots `worker` reports (how many of them it takes while none can end).
async fn behind_a_gate(system: &System, worker: i64, count: usize) -> (std::path::PathBuf, Vec<i64>, i64) {
    let gate = std::env::temp_dir().join(format!("attune-gate-{:08x}", rand::random::<u32>()));
    let submissions = (0..count).map(|_| system.submit("e2e.gate", json!({"gate": gate})));
    let ids = futures_util::future::join_all(submissions).await.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    let slots = sqlx::query_scalar("SELECT (capabilities->>'slots')::bigint FROM worker WHERE id = $1")
        .bind(worker)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    (gate, ids, slots)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_every_workers_capacity_waits_instead_of_failing() {
    // Thirty runs behind a closed gate on a worker with 2 run slots (and a look-ahead of 2): the
    // worker fills its slots and the rest of the burst waits as `requested` rows, whatever the
    // speed of the machine or of its database logins, until the gate opens.
    let system = System::builder()
        .env("ATTUNE_HEALTH_QUEUE_DEPTH_DEGRADED", "3")
        .env("ATTUNE_HEALTH_QUEUE_DEPTH_UNHEALTHY", "5")
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.2")
        .pack(attune_testkit::system::repo_root().join("testkit/packs/e2e"))
        .worker("w1", &[("ATTUNE_WORKER_CONCURRENCY", "2")])
        .start()
        .await;
    let w1 = system.worker_id("w1").await;
    let (gate, ids, slots) = behind_a_gate(&system, w1, 30).await;
    assert!(slots < 5, "the worker takes fewer than its unhealthy queue depth: {slots}");
    // nothing finishes while the gate is closed: the worker's slots fill, and stay full
    attune_testkit::wait_for("the worker's slots to fill", DEADLINE, || async {
        (system.count_on(w1, &["scheduled", "running"]).await == slots).then_some(())
    })
    .await;
    let (waiting, claimed): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'requested'), count(*) FILTER (WHERE status = 'scheduling') \
         FROM execution WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    // a request waiting for capacity writes nothing: its execution stays `requested`
    assert_eq!((waiting, claimed), (30 - slots, 0), "the rest of the burst waits, unclaimed");
    std::fs::write(&gate, "open").unwrap();
    for id in &ids {
        // once runs are timed the look-ahead may grow; the health bound holds at every moment
        // of the drain: at 5 in flight the worker is unhealthy and gets nothing more
        let in_flight = system.count_on(w1, &["scheduled", "running"]).await;
        assert!(in_flight <= 5, "no more than the unhealthy queue depth in flight: {in_flight}");
        let execution = system.wait_terminal(*id, DEADLINE).await;
        assert_eq!(execution["status"], "completed", "{execution}");
        assert_eq!(execution["retry_count"], 0, "waiting spent no retry: {execution}");
    }
    let _ = std::fs::remove_file(&gate);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_every_worker_is_full_the_scheduler_reads_the_in_flight_counts_a_few_times_a_second() {
    // Gated runs fill the one worker's 2 slots and its look-ahead; the rest of the burst waits.
    // Only a run's end makes room, and none ends: the scheduler's looks at the full runtime
    // (each a read of the in-flight counts) back off, and more requests, each announced, are
    // no reason to look. It read them every 10 ms, and again for every announced request.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let system = System::builder()
        .env("ATTUNE_METRICS_ADDR", &format!("127.0.0.1:{port}"))
        .pack(attune_testkit::system::repo_root().join("testkit/packs/e2e"))
        .worker("w1", &[("ATTUNE_WORKER_CONCURRENCY", "2"), ("ATTUNE_METRICS_ADDR", "127.0.0.1:0")])
        .start()
        .await;
    let w1 = system.worker_id("w1").await;
    let (gate, mut ids, slots) = behind_a_gate(&system, w1, 20).await;
    attune_testkit::wait_for("the worker's slots to fill", DEADLINE, || async {
        (system.count_on(w1, &["scheduled", "running"]).await == slots).then_some(())
    })
    .await;
    let reads = || async {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        metric_sample(&text, "attune_scheduler_inflight_reads_total")
    };
    let (before, started) = (reads().await, std::time::Instant::now());
    assert!(before >= 1.0, "the executor's metrics count its reads");
    // two seconds of a full runtime, with a new request every 50 ms
    while started.elapsed() < Duration::from_secs(2) {
        ids.push(system.submit("e2e.gate", json!({"gate": gate})).await["id"].as_i64().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let per_second = (reads().await - before) / started.elapsed().as_secs_f64();
    assert!(per_second < 20.0, "{per_second:.1} reads of the in-flight counts a second while the worker is full");
    // and the room a run's end makes is still found
    std::fs::write(&gate, "open").unwrap();
    for id in &ids {
        assert_eq!(system.wait_terminal(*id, DEADLINE).await["status"], "completed");
    }
    let _ = std::fs::remove_file(&gate);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reports_a_change_of_its_execution_time_without_waiting_for_its_next_heartbeat() {
    // The scheduler times its looks at a full worker by the recent execution time the worker
    // last reported. Heartbeats come every 20 s here: after slow runs, fast ones must be known
    // within seconds, or the fast runs would wait for looks timed by the slow ones (core.echo
    // after core.python_echo: 434 and 564/s where it made 789 and 841).
    let system = System::builder()
        .env("ATTUNE_HEARTBEAT_INTERVAL_SECS", "20")
        .env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "60")
        .worker("w1", &[])
        .start()
        .await;
    let w1 = system.worker_id("w1").await;
    let reported = || async {
        sqlx::query_scalar::<_, Option<f64>>(
            "SELECT (capabilities->>'recent_execution_time_ms')::float8 FROM worker WHERE id = $1",
        )
        .bind(w1)
        .fetch_one(&system.db.pool)
        .await
        .unwrap()
    };
    for _ in 0..2 {
        let id = system.submit("core.sleep", json!({"seconds": 0.5})).await["id"].as_i64().unwrap();
        assert_eq!(system.wait_terminal(id, DEADLINE).await["status"], "completed");
    }
    let soon = Duration::from_secs(10);
    let slow = attune_testkit::wait_for("the slow runs' time to be reported", soon, || async {
        reported().await.filter(|ms| *ms >= 250.0)
    })
    .await;
    for _ in 0..15 {
        let id = system.submit("core.echo", json!({"message": "quick"})).await["id"].as_i64().unwrap();
        assert_eq!(system.wait_terminal(id, DEADLINE).await["status"], "completed");
    }
    let fast = attune_testkit::wait_for("the fast runs' time to be reported", soon, || async {
        reported().await.filter(|ms| *ms < slow / 2.0)
    })
    .await;
    assert!(fast < 250.0, "{slow} ms, then {fast} ms");
    system.stop().await;
}
