//! attune through a PostgreSQL switchover (`scripts/test-pg-standby.sh`, run by `make
//! test-cluster`; it needs root and Debian's PostgreSQL 15): a primary and its synchronous
//! streaming standby, every service given both in `DATABASE_URL` (libpq's multi-host form with
//! `target_session_attrs=read-write`, `db::failover`). Three streams of submissions go on while
//! the primary stops and the standby is promoted. Every submission the API answered 201 for is in
//! the record and its chain completed, nothing the API refused was written, each attempt ran once
//! (the action marks each run with its execution id), and the services — the same processes —
//! say they moved to the new primary, within seconds of its promotion. And with the standby
//! stopped for 12 s (every commit waits, reads go on), a run goes on to its end (ADR 0011).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use attune_testkit::system::repo_root;
use attune_testkit::{System, wait_for};
use serde_json::json;

const EXECUTIONS: usize = 150;
const STREAMS: usize = 3;
/// The services, as the system names them.
const SERVICES: [&str; 4] = ["api", "executor", "executor2", "w1"];
/// What a pool logs when it moves (`db::failover`).
const MOVED: &str = "moved to another database host";

fn pair(args: &[&str]) -> String {
    let out = Command::new(repo_root().join("scripts/test-pg-standby.sh")).args(args).output().unwrap();
    assert!(out.status.success(), "test-pg-standby.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The first time `needle` appears in `log`, by the line's timestamp.
fn first_logged(log: &str, needle: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let line = log.lines().find(|line| line.contains(needle))?;
    chrono::DateTime::parse_from_rfc3339(line.split_whitespace().next()?).ok().map(|at| at.to_utc())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and the PostgreSQL pair of scripts/test-pg-standby.sh: make test-cluster"]
async fn executions_complete_once_through_a_switchover() {
    pair(&["start"]);
    let url = pair(&["urls"]);
    let marks = std::env::temp_dir().join(format!("attune-pgso-marks-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&marks).unwrap();
    let pack = attune_testkit::runs::marking_pack("pgso", &marks);
    let mut system = System::builder()
        .database(&url)
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin")])
        .start()
        .await;
    system.spawn_executor("executor2");
    let pids: Vec<u32> = SERVICES.iter().map(|name| system.pid(name)).collect();
    let port: i32 = sqlx::query_scalar("SELECT inet_server_port()").fetch_one(&system.db.pool).await.unwrap();
    assert_eq!(port, 5695, "the system did not start on the primary");

    // three streams of submissions; when a third of them are in, the switchover, beside them
    let system = Arc::new(system);
    let submitted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let streams: Vec<_> = (0..STREAMS)
        .map(|stream| {
            let (system, submitted) = (system.clone(), submitted.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for n in (stream..EXECUTIONS).step_by(STREAMS) {
                    let body = json!({"action_ref": "pgso.mark", "parameters": {"n": n}});
                    let (status, answer) = system.post("/api/v1/executions", &body).await;
                    answers.push((n, status, answer));
                    submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // (pacing, not synchronisation: a stream that lasts through the switchover)
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                answers
            })
        })
        .collect();
    let counting = submitted.clone();
    wait_for("a third of the submissions", Duration::from_secs(60), || {
        let counting = counting.clone();
        async move { (counting.load(std::sync::atomic::Ordering::Relaxed) >= EXECUTIONS / 3).then_some(()) }
    })
    .await;
    let switching = Instant::now();
    tokio::task::spawn_blocking(|| pair(&["switchover"])).await.unwrap();
    let promoted = chrono::Utc::now();
    eprintln!("switchover took {:?}", switching.elapsed());
    let mut answers = Vec::new();
    for stream in streams {
        answers.extend(stream.await.unwrap());
    }
    let mut system = Arc::into_inner(system).expect("the streams are done");

    // every submission was answered 201, or refused as the database being unavailable (which
    // writes nothing)
    let mut accepted: Vec<(usize, i64)> = Vec::new();
    let mut refused = Vec::new();
    for (n, status, answer) in &answers {
        match status {
            201 => accepted.push((*n, answer["id"].as_i64().unwrap())),
            503 if answer["code"] == "unavailable" => refused.push(*n),
            _ => panic!("submission {n} answered {status}: {answer}"),
        }
    }
    eprintln!("{} submissions accepted, {} refused while the database moved", accepted.len(), refused.len());
    assert!(accepted.len() >= EXECUTIONS * 9 / 10, "too many refused: {refused:?}");
    assert!(
        answers.iter().filter(|(n, ..)| *n >= EXECUTIONS * 9 / 10).all(|(_, status, _)| *status == 201),
        "the API does not accept submissions again after the switchover: {refused:?}"
    );

    // the test's own pool moved too: the record is read from the promoted standby
    let pool = system.db.pool.clone();
    let port: i32 = sqlx::query_scalar("SELECT inet_server_port()").fetch_one(&pool).await.unwrap();
    assert_eq!(port, 5696, "the record is not read from the promoted standby");
    wait_for("every chain to complete", Duration::from_secs(120), || {
        let pool = pool.clone();
        async move {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM execution WHERE status IN ('requested', 'scheduled', 'running', 'delayed')",
            )
            .fetch_one(&pool)
            .await
            .ok()?;
            (open == 0).then_some(())
        }
    })
    .await;
    let took = started.elapsed();

    // the submissions in the record are exactly those answered 201: none lost, none written
    // unanswered or twice
    let mut firsts: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM execution WHERE original_execution IS NULL ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut answered: Vec<i64> = accepted.iter().map(|(_, id)| *id).collect();
    answered.sort_unstable();
    firsts.sort_unstable();
    assert_eq!(firsts, answered, "the record's submissions are not those answered 201");
    // each chain ended completed; the action ran once per attempt the record has
    let mut retried = 0;
    for (n, id) in &accepted {
        let chain: Vec<(i64, String)> = sqlx::query_as(
            "WITH RECURSIVE c(id) AS (SELECT $1::bigint UNION SELECT e.id FROM execution e JOIN c ON e.original_execution = c.id) \
             SELECT e.id, e.status::text FROM execution e JOIN c USING (id) ORDER BY e.id",
        )
        .bind(id)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(chain.last().map(|c| c.1.as_str()), Some("completed"), "submission {n}: {chain:?}");
        retried += chain.len() - 1;
        let ran = std::fs::read_to_string(marks.join(n.to_string())).unwrap_or_default();
        let runs: Vec<i64> = ran.lines().map(|l| l.parse().unwrap()).collect();
        let attempts: Vec<i64> = chain.iter().map(|c| c.0).collect();
        assert!(runs.iter().all(|r| attempts.contains(r)), "submission {n} ran outside its chain: {runs:?} {chain:?}");
        let mut once = runs.clone();
        once.sort_unstable();
        once.dedup();
        assert_eq!(once.len(), runs.len(), "submission {n}: an attempt ran twice: {runs:?} {chain:?}");
        assert!(!runs.is_empty(), "submission {n} completed without running: {chain:?}");
    }
    eprintln!("the stream took {took:?}; {retried} retries in the chains");
    assert!(took < Duration::from_secs(90), "the stream took {took:?}");

    // the services are the processes started before the switchover, and each says it moved to
    // the promoted standby, within seconds of its promotion
    for (name, pid) in SERVICES.iter().zip(&pids) {
        assert!(system.is_running(name), "{name} exited");
        assert_eq!(system.pid(name), *pid, "{name} was restarted");
        let log = system.log(name);
        let moved = first_logged(&log, MOVED).unwrap_or_else(|| panic!("{name} does not say it moved:\n{log}"));
        assert!(log.contains("to=127.0.0.1:5696"), "{name} moved elsewhere:\n{log}");
        let after = (moved - promoted).num_milliseconds();
        eprintln!("{name} moved {after} ms after the promotion");
        assert!(after < 10_000, "{name} moved {after} ms after the promotion");
    }
    // the executors listen for new requests again, on the new primary
    for name in ["executor", "executor2"] {
        let log = system.log(name);
        let again = first_logged(&log, "listening for new requests again");
        assert!(
            again.is_some_and(|at| at > promoted - chrono::TimeDelta::seconds(5)),
            "{name} does not listen again:\n{log}"
        );
    }
    // and its metric counts the move
    let (status, metrics) = system.get("/metrics").await;
    let metrics = metrics.as_str().map(str::to_string).unwrap_or_default();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("attune_database_host_moves_total{host=\"127.0.0.1:5696\"}"),
        "no move in the API's metrics: {metrics}"
    );
    system.stop().await;
    let _ = std::fs::remove_dir_all(&marks);
}

/// Issue 46, ADR 0011: the synchronous standby goes away (stopped), so every commit on the
/// primary waits while reads go on, for 12 s (more than twice the heartbeat limit of 5 s), then
/// comes back. A run that was going on is neither stopped nor failed, nor run again: the
/// executors' pulses are commits, so they count the stall as an outage, and tell the workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and the PostgreSQL pair of scripts/test-pg-standby.sh: make test-cluster"]
async fn a_synchronous_standby_that_goes_away_stops_no_run() {
    use attune_testkit::runs::{spans, ticks_pack};
    pair(&["start"]);
    let url = pair(&["urls"]);
    let pack = ticks_pack("stall", 0, 20);
    let log = std::env::temp_dir().join(format!("attune-stall-{:016x}.log", rand::random::<u64>()));
    let system = System::builder()
        .database(&url)
        .env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "5")
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.5")
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell")])
        .start()
        .await;
    let run = system.submit("stall.run", json!({"log": log.display().to_string(), "seconds": 18})).await;
    let id = run["id"].as_i64().unwrap();
    wait_for("the run to start", Duration::from_secs(60), || async { spans(&log).contains_key(&id).then_some(()) })
        .await;

    tokio::task::spawn_blocking(|| pair(&["standby-stop"])).await.unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    tokio::task::spawn_blocking(|| pair(&["standby-start"])).await.unwrap();

    let chain = system.wait_chain(id, Duration::from_secs(90)).await;
    assert_eq!(chain.len(), 1, "not retried: {chain:#?}");
    assert_eq!(chain[0]["status"], "completed", "{chain:#?}");
    let (start, end) = spans(&log)[&id];
    assert!(end - start >= 17_000_000_000, "the run went on to its end: {:.2} s", (end - start) as f64 / 1e9);
    // the stall was one: the executor saw its pulses wait, and the worker held its lease
    assert!(system.log("executor").contains("the database cannot be written"), "{}", system.log("executor"));
    assert!(system.log("w1").contains("no executor can take this worker for dead"), "{}", system.log("w1"));
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}
