//! Dispatch by real capacity, with the real binaries: ordinary load never fails work that did
//! not run, one runtime's backlog does not hold up another, a stopping worker hands back what it
//! had not started, and a burst is not amplified. (The broker restart with requests waiting is in
//! `chaos_broker.rs`, which runs alone.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use attune_testkit::system::repo_root;
use attune_testkit::{System, wait_for};
use serde_json::{Value, json};

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// Every execution in the database, with how it ended: (status, failure kind) → count.
async fn outcomes(system: &System) -> BTreeMap<(String, String), i64> {
    let rows: Vec<(String, Option<String>, i64)> =
        sqlx::query_as("SELECT status::text, failure_kind, count(*) FROM execution GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(&system.db.pool)
            .await
            .unwrap();
    rows.into_iter().map(|(status, kind, n)| ((status, kind.unwrap_or_default()), n)).collect()
}

/// How many times each execution's action ran, from the `e2e.record` log file.
fn runs(log: &std::path::Path) -> BTreeMap<i64, usize> {
    let mut runs = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        *runs.entry(line.trim().parse::<i64>().unwrap()).or_default() += 1;
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_longer_than_the_queue_ttl_completes_on_a_healthy_worker() {
    // 16 × 5 s on 2 run slots is 40 s of work, far past the 15 s queue TTL
    let system = System::builder()
        .worker("w1", &[("ATTUNE_WORKER_CONCURRENCY", "2"), ("ATTUNE_WORKER_QUEUE_TTL_SECS", "15")])
        .env("ATTUNE_WORKER_QUEUE_TTL_SECS", "15")
        .start()
        .await;
    let submissions = (0..16).map(|_| system.submit("core.sleep", json!({"seconds": 5})));
    let ids: Vec<i64> = futures_util::future::join_all(submissions).await.iter().map(id).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut most_dispatched = 0;
    loop {
        let (status, dispatched, open): (String, i64, i64) = sqlx::query_as(
            "SELECT (SELECT status FROM worker WHERE name = 'w1'), \
                    count(*) FILTER (WHERE status IN ('scheduled', 'running')), \
                    count(*) FILTER (WHERE finished IS NULL) \
             FROM execution",
        )
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
        assert_eq!(status, "active", "the worker stays active throughout");
        most_dispatched = most_dispatched.max(dispatched);
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the backlog did not finish: {:?}", outcomes(&system).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let outcomes = outcomes(&system).await;
    assert_eq!(outcomes, BTreeMap::from([(("completed".into(), String::new()), 16)]), "16/16, no failure, no retry");
    // concurrency 2 + a look-ahead of 2 until the first 5 s execution is timed, then 1 (a second
    // dispatch held ahead would wait more than a quarter of the 15 s TTL): never more dispatched
    // than the worker's slots
    assert!(most_dispatched <= 4, "dispatched beyond the worker's slots: {most_dispatched}");
    for id in ids {
        let (_, execution) = system.get(&format!("/api/v1/executions/{id}")).await;
        assert_eq!(execution["status"], "completed", "{execution}");
    }
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_nobody_offers_does_not_hold_up_the_others() {
    let system = System::builder().worker("shell-only", &[("ATTUNE_WORKER_RUNTIMES", "shell")]).start().await;
    for _ in 0..80 {
        system.submit("core.python_echo", json!({"message": "waits"})).await;
    }
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(id(&system.submit("core.echo", json!({"message": format!("shell {i}")})).await));
    }
    for id in ids {
        let execution = system.wait_terminal(id, Duration::from_secs(30)).await;
        assert_eq!(execution["status"], "completed", "{execution}");
        let created = chrono::DateTime::parse_from_rfc3339(execution["created"].as_str().unwrap()).unwrap();
        let updated = chrono::DateTime::parse_from_rfc3339(execution["updated"].as_str().unwrap()).unwrap();
        let took = (updated - created).num_milliseconds();
        assert!(took < 3000, "a shell action finished {took} ms after its submission, behind the python backlog");
    }
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM execution WHERE runtime = 'python' AND status = 'requested'")
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
    assert_eq!(waiting, 80, "the python requests are still waiting, nothing failed yet");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_with_the_default_name_hands_back_and_removes_its_queue() {
    let dir = tempdir("sigterm");
    let log = dir.join("runs.log");
    let mut system = System::builder()
        .pack(repo_root().join("testkit/packs/e2e"))
        .worker("w1", &[("ATTUNE_WORKER_CONCURRENCY", "2")])
        .worker("default-named", &[("ATTUNE_WORKER_NAME", ""), ("ATTUNE_WORKER_CONCURRENCY", "2")])
        .start()
        .await;
    let (stopping, queue): (i64, String) =
        sqlx::query_as("SELECT id, capabilities->>'queue' FROM worker WHERE name <> 'w1'")
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
    let parameters = json!({"log": log.display().to_string(), "seconds": 1});
    let mut ids = Vec::new();
    for i in 0..40 {
        if i == 15 {
            // it has work running and dispatches held: SIGTERM, with the stream going on
            system.wait_count_on("work on the stopping worker", stopping, &["running"], |n| n >= 1).await;
            system.signal("default-named", 15);
        }
        ids.push(id(&system.submit("e2e.record", parameters.clone()).await));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in &ids {
        let execution = system.wait_terminal(*id, Duration::from_secs(120)).await;
        assert_eq!(execution["status"], "completed", "{execution}");
    }
    let outcomes = outcomes(&system).await;
    assert_eq!(outcomes, BTreeMap::from([(("completed".into(), String::new()), 40)]), "none failed, none retried");
    let runs = runs(&log);
    assert_eq!(runs.len(), 40, "every execution ran");
    assert!(runs.values().all(|n| *n == 1), "an execution ran twice: {runs:?}");
    let (status,): (String,) = sqlx::query_as("SELECT status FROM worker WHERE id = $1")
        .bind(stopping)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(status, "inactive");
    let worker_log = system.log("default-named");
    assert!(worker_log.contains("worker queue deleted"), "{worker_log}");
    let publisher = attune_common::mq::Publisher::new(
        &attune_testkit::amqp_url(),
        "attune-test",
        attune_common::mq::Topology::new(&system.namespace.name, Duration::from_secs(300)),
    );
    assert!(publisher.queue_length(&queue).await.is_err(), "the stopped worker's queue {queue} is gone");
    let _ = std::fs::remove_dir_all(&dir);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_at_once_all_complete_without_amplification() {
    let system = System::builder().worker("w1", &[]).worker("w2", &[]).start().await;
    // the most executions dispatched to one worker and unfinished, sampled while the burst runs
    let sampler = {
        let pool = system.db.pool.clone();
        tokio::spawn(async move {
            let mut most = 0i64;
            loop {
                let sample: Option<i64> = sqlx::query_scalar(
                    "SELECT max(n) FROM (SELECT count(*) AS n FROM execution \
                     WHERE status IN ('scheduled', 'running') GROUP BY worker) per_worker",
                )
                .fetch_one(&pool)
                .await
                .unwrap_or(None);
                most = most.max(sample.unwrap_or(0));
                let open: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE finished IS NULL")
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(1);
                if open == 0 && most > 0 {
                    return most;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let started = Instant::now();
    let mut ids = Vec::new();
    for _ in 0..100 {
        let submissions = (0..50).map(|_| system.submit("core.noop", json!({})));
        ids.extend(futures_util::future::join_all(submissions).await.iter().map(id));
    }
    wait_for("5,000 executions to finish", Duration::from_secs(300), || async {
        let open: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE finished IS NULL")
            .fetch_one(&system.db.pool)
            .await
            .ok()?;
        (open == 0).then_some(())
    })
    .await;
    let outcomes = outcomes(&system).await;
    assert_eq!(outcomes, BTreeMap::from([(("completed".into(), String::new()), 5000)]));
    // a dispatch per execution, and one more only for what went back to waiting; several to a
    // worker in one message
    let executor = system.log("executor");
    let messages: Vec<usize> = executor
        .split("dispatched executions=")
        .skip(1)
        .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
        .collect();
    let dispatches: usize = messages.iter().sum();
    let workers = [system.log("w1"), system.log("w2")];
    // back to waiting by the executor, or by a worker that held a dispatch longer than its hold
    // limit (a slow machine's noop can take that long to get a slot)
    let handed_back = executor.matches("the execution waits again").count()
        + workers
            .iter()
            .map(|log| log.matches("dispatch held here and not started handed back").count())
            .sum::<usize>();
    let stale = workers.iter().map(|log| log.matches("dispatch is stale").count()).sum::<usize>();
    eprintln!(
        "5,000 core.noop in {:.1} s: {dispatches} dispatches in {} messages, {handed_back} handed back, {stale} stale dispatches, 0 re-published requests",
        started.elapsed().as_secs_f64(),
        messages.len()
    );
    assert!(!executor.contains("re-publishing"), "the monitor re-publishes nothing");
    assert_eq!(dispatches, 5000 + handed_back, "one dispatch per execution");
    assert!(messages.len() * 2 <= dispatches, "{} dispatch messages for {dispatches} dispatches", messages.len());
    assert!(handed_back <= 50, "handed back: {handed_back}");
    assert_eq!(ids.len(), 5000);
    let most_dispatched = sampler.await.unwrap();
    eprintln!("at most {most_dispatched} executions dispatched and unfinished on one worker");
    // the default slots: concurrency 4 + at most `ATTUNE_WORKER_PREFETCH` (16) ahead (one
    // executor: its picture is exact)
    assert!(most_dispatched <= 20, "a worker got more than its slots: {most_dispatched}");
    system.stop().await;
}

fn tempdir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("attune-{what}-{}-{:x}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
