//! A worker holds a lease on its runs (docs/adr/0008-a-worker-holds-a-lease-on-its-runs.md), with
//! the real binaries: cut off from PostgreSQL without a reset (a partition), it stops its run
//! before the executors may take it for dead and retry the execution elsewhere, so the two runs
//! of one execution never overlap (issue 31).

use std::time::Duration;

use attune_testkit::pgcut::PgCut;
use attune_testkit::runs::{spans, ticks_pack};
use attune_testkit::{System, TempPack, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

/// A system whose executors take a worker for dead after 5 s without a heartbeat (its lease:
/// 3.75 s) and retry at once; no worker yet.
fn fenced() -> attune_testkit::SystemBuilder {
    System::builder()
        .env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "5")
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.5")
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.1")
}

/// A worker offering `runtime` that reaches PostgreSQL through a proxy the test can partition;
/// returns the proxy once the worker consumes.
async fn start_cut_off(system: &mut System, runtime: &str) -> PgCut {
    let cut = PgCut::start("127.0.0.1:5432").await;
    let name = format!("cut-{:08x}", rand::random::<u32>());
    system.restart_with(&name, &[("DATABASE_URL", &cut.url(&system.db.url)), ("ATTUNE_WORKER_RUNTIMES", runtime)]);
    system.wait_consuming(&name).await;
    cut
}

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_the_database_stops_its_run_before_the_execution_runs_elsewhere() {
    let pack = ticks_pack("fence", 2, 20);
    let log = std::env::temp_dir().join(format!("attune-lease-{:016x}.log", rand::random::<u64>()));
    let mut system = fenced().pack(pack.path()).start().await;
    let other = format!("other-{:08x}", rand::random::<u32>());
    let cut = start_cut_off(&mut system, "shell").await;
    let first = system.submit("fence.run", json!({"log": log.display().to_string(), "seconds": 25})).await;
    wait_for("the run to start", DEADLINE, || async { spans(&log).contains_key(&id(&first)).then_some(()) }).await;
    system.restart_with(&other, &[("ATTUNE_WORKER_RUNTIMES", "shell")]);
    system.wait_consuming(&other).await;

    // 15 s of partition: the executors take the cut-off worker for dead and retry elsewhere
    cut.partition();
    let healed_at = tokio::time::Instant::now() + Duration::from_secs(15);
    let chain = wait_for("the retry to start on the other worker", Duration::from_secs(15), || async {
        let (_, chain) = system.get(&format!("/api/v1/executions/{}/chain", id(&first))).await;
        let attempts = chain["attempts"].as_array()?.clone();
        let retry = attempts.get(1)?;
        spans(&log).contains_key(&id(retry)).then_some(attempts)
    })
    .await;
    tokio::time::sleep_until(healed_at).await;
    cut.heal();

    let retry = id(&chain[1]);
    let last = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(last.len(), 2, "{last:#?}");
    assert_eq!(last[0]["failure_kind"], "worker_heartbeat_stale", "{last:#?}");
    assert_eq!(last[1]["status"], "completed", "{last:#?}");
    let spans = spans(&log);
    let (original, again) = (spans[&id(&first)], spans[&retry]);
    assert!(
        original.1 < again.0,
        "the original run was last seen {:.2} s after the retry started",
        (original.1 - again.0) as f64 / 1e9
    );
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_s_run_is_stopped_by_its_supervisor_before_the_execution_runs_elsewhere() {
    const SIGSTOP: i32 = 19;
    const SIGCONT: i32 = 18;
    let pack = ticks_pack("fence", 2, 20);
    let log = std::env::temp_dir().join(format!("attune-lease-{:016x}.log", rand::random::<u64>()));
    let frozen = format!("frozen-{:08x}", rand::random::<u32>());
    let other = format!("other-{:08x}", rand::random::<u32>());
    let mut system = fenced().worker(&frozen, &[("ATTUNE_WORKER_RUNTIMES", "shell")]).pack(pack.path()).start().await;
    let first = system.submit("fence.run", json!({"log": log.display().to_string(), "seconds": 15})).await;
    wait_for("the run to start", DEADLINE, || async { spans(&log).contains_key(&id(&first)).then_some(()) }).await;
    system.restart_with(&other, &[("ATTUNE_WORKER_RUNTIMES", "shell")]);
    system.wait_consuming(&other).await;

    // the worker stops (a stalled VM, SIGSTOP): its action, another process, would run on
    system.signal(&frozen, SIGSTOP);
    let chain = wait_for("the retry to start on the other worker", Duration::from_secs(20), || async {
        let (_, chain) = system.get(&format!("/api/v1/executions/{}/chain", id(&first))).await;
        let attempts = chain["attempts"].as_array()?.clone();
        let retry = attempts.get(1)?;
        spans(&log).contains_key(&id(retry)).then_some(attempts)
    })
    .await;
    let retry = id(&chain[1]);
    let last = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(last[0]["failure_kind"], "worker_heartbeat_stale", "{last:#?}");
    assert_eq!(last[1]["status"], "completed", "{last:#?}");
    let spans = spans(&log);
    let (original, again) = (spans[&id(&first)], spans[&retry]);
    assert!(
        original.1 < again.0,
        "the frozen worker's run was last seen {:.2} s after the retry started",
        (original.1 - again.0) as f64 / 1e9
    );
    system.signal(&frozen, SIGCONT);
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_the_database_aborts_its_http_request_before_the_execution_runs_elsewhere() {
    use attune_testkit::http_server::{HttpServer, Reply};
    // an http action runs inside the worker (no supervisor): only the worker's own look at its
    // lease stops it
    let server = HttpServer::start().await;
    server.script("/slow", [Reply::status(200).after(Duration::from_secs(60)), Reply::status(200)]);
    let call = format!(
        "name: call\nruntime: http\ntimeout_seconds: 120\nmax_retries: 2\n\
         http:\n  url: \"http://127.0.0.1:{}/slow\"\n",
        server.port()
    );
    let pack = TempPack::new("fencehttp", &[("call.yaml", &call)]);
    let mut system = fenced().allow_http_to_loopback().pack(pack.path()).start().await;
    let other = format!("other-{:08x}", rand::random::<u32>());
    let cut = start_cut_off(&mut system, "http").await;
    let first = system.submit("fencehttp.call", json!({})).await;
    server.wait_requests("/slow", 1, DEADLINE).await;
    system.restart_with(&other, &[("ATTUNE_WORKER_RUNTIMES", "http")]);
    system.wait_consuming(&other).await;

    cut.partition();
    let healed_at = tokio::time::Instant::now() + Duration::from_secs(15);
    let requests = server.wait_requests("/slow", 2, Duration::from_secs(15)).await;
    tokio::time::sleep_until(healed_at).await;
    cut.heal();

    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain[0]["failure_kind"], "worker_heartbeat_stale", "{chain:#?}");
    assert_eq!(chain.last().unwrap()["status"], "completed", "{chain:#?}");
    let hung_up = server.hung_up_at("/slow");
    assert_eq!(hung_up.len(), 1, "the first request was aborted");
    assert!(
        hung_up[0] < requests[1].received,
        "the first request was aborted {:?} after the retry's was sent",
        hung_up[0] - requests[1].received
    );
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ends_while_its_worker_is_cut_off_is_recorded_once_and_not_run_again() {
    let pack = ticks_pack("fence", 2, 20);
    let log = std::env::temp_dir().join(format!("attune-lease-{:016x}.log", rand::random::<u64>()));
    let mut system = fenced().pack(pack.path()).start().await;
    let cut = start_cut_off(&mut system, "shell").await;
    let first = system.submit("fence.run", json!({"log": log.display().to_string(), "seconds": 2})).await;
    wait_for("the run to start", DEADLINE, || async { spans(&log).contains_key(&id(&first)).then_some(()) }).await;
    // cut off for 12 s: the run ends 2 s in, well inside the lease, and the worker cannot write
    // its success; the executors take the worker for dead 5 s after its last heartbeat
    cut.partition();
    let healed_at = tokio::time::Instant::now() + Duration::from_secs(12);
    let view = system.wait_terminal(id(&first), Duration::from_secs(12)).await;
    tokio::time::sleep_until(healed_at).await;
    cut.heal();
    assert_eq!(view["status"], "completed", "recorded as what it was: {view}");
    // and it stays so once the worker is back (its own write of the success misses)
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.len(), 1, "not run again: {chain:#?}");
    assert_eq!(chain[0]["status"], "completed", "{chain:#?}");
    assert_eq!(spans(&log).len(), 1, "one run");
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}

/// Issue 46: a database outage that the executors share (a restart, a failover, a synchronous
/// standby gone) is no reason for a worker to stop its runs: no executor can take it for dead
/// while cut off, and none does until the workers have had a heartbeat limit to report again
/// (docs/adr/0011-an-outage-everyone-shares-stops-nothing.md). With a heartbeat limit of 5 s,
/// an outage of 12 s (more than twice the limit, as 60 s is for the default 30 s) stops nothing,
/// fails nothing, and runs nothing twice, though no action may be retried; a run that ends
/// during it is recorded as what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_the_executors_share_stops_no_run_and_fails_nothing() {
    let pack = ticks_pack("fence", 0, 20);
    let log = std::env::temp_dir().join(format!("attune-lease-{:016x}.log", rand::random::<u64>()));
    let mut system = fenced().pack(pack.path()).start().await;
    // the executor and the worker reach PostgreSQL through one proxy, which the test partitions
    let cut = PgCut::start("127.0.0.1:5432").await;
    system.restart_with("executor", &[("DATABASE_URL", &cut.url(&system.db.url))]);
    let name = format!("shared-{:08x}", rand::random::<u32>());
    system.restart_with(&name, &[("DATABASE_URL", &cut.url(&system.db.url)), ("ATTUNE_WORKER_RUNTIMES", "shell")]);
    system.wait_consuming(&name).await;
    let long = system.submit("fence.run", json!({"log": log.display().to_string(), "seconds": 18})).await;
    let short = system.submit("fence.run", json!({"log": log.display().to_string(), "seconds": 5})).await;
    wait_for("both runs to start", DEADLINE, || async {
        let spans = spans(&log);
        (spans.contains_key(&id(&long)) && spans.contains_key(&id(&short))).then_some(())
    })
    .await;

    cut.partition();
    tokio::time::sleep(Duration::from_secs(12)).await;
    cut.heal();

    for (what, execution) in [("the run that outlasts the outage", &long), ("the run that ends during it", &short)] {
        let chain = system.wait_chain(id(execution), DEADLINE).await;
        assert_eq!(chain.len(), 1, "{what}: not retried: {chain:#?}");
        assert_eq!(chain[0]["status"], "completed", "{what}: {chain:#?}");
    }
    let spans = spans(&log);
    let (start, end) = spans[&id(&long)];
    assert!(end - start >= 17_000_000_000, "the long run went on to its end: {:.2} s", (end - start) as f64 / 1e9);
    let worker = system.log(&name);
    assert!(!worker.contains("no heartbeat has landed within the lease: stopping"), "{worker}");
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}

/// Issue 46 (review R6): a lease file that can no longer be renewed (a directory planted at its
/// temporary name, a full or read-only temp dir) kills no run: the worker's supervisor is told
/// the lease over its socket, and the file lives in a directory of the worker's own. Only a
/// per-action fallback supervisor reads the file, and any run may need one: so while the file
/// cannot be renewed the worker reports itself unhealthy and starts nothing new (what it is
/// dispatched waits for it, or for another worker), and it takes work again once a renewal lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_file_that_cannot_be_renewed_kills_no_run_and_stops_the_worker_s_intake() {
    let pack = ticks_pack("fence", 0, 20);
    let log = std::env::temp_dir().join(format!("attune-lease-{:016x}.log", rand::random::<u64>()));
    let name = format!("sabotaged-{:08x}", rand::random::<u32>());
    let system = fenced().worker(&name, &[("ATTUNE_WORKER_RUNTIMES", "shell")]).pack(pack.path()).start().await;
    let (worker_id, pid) = (system.worker_id(&name).await, system.pid(&name));
    let prefix = format!("attune-worker-{worker_id}-{pid}");
    let lease = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .find(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| if entry.path().is_dir() { entry.path().join("lease") } else { entry.path() })
        .expect("the worker's lease file");
    let health = || async {
        sqlx::query_scalar::<_, Option<String>>("SELECT capabilities->'health'->>'status' FROM worker WHERE id = $1")
            .bind(worker_id)
            .fetch_one(&system.db.pool)
            .await
            .unwrap()
            .unwrap_or_default()
    };
    let run = system.submit("fence.run", json!({"log": log.display().to_string(), "seconds": 8})).await;
    wait_for("the run to start", DEADLINE, || async { spans(&log).contains_key(&id(&run)).then_some(()) }).await;
    // what an action of the worker's own user could once do to it: renewals fail from now on
    let mut next = lease.clone().into_os_string();
    next.push(".next");
    std::fs::create_dir(&next).unwrap();
    wait_for("the worker to report itself unhealthy", DEADLINE, || async {
        (health().await == "unhealthy").then_some(())
    })
    .await;
    // no new work starts while the renewals fail; the run that runs goes on to its end
    let waiting = system.submit("fence.run", json!({"log": log.display().to_string(), "seconds": 1})).await;
    let chain = system.wait_chain(id(&run), DEADLINE).await;
    assert_eq!(chain.len(), 1, "{chain:#?}");
    assert_eq!(chain[0]["status"], "completed", "{chain:#?}");
    assert_eq!(health().await, "unhealthy", "still unhealthy while the renewals fail");
    let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&waiting))).await;
    assert!(matches!(view["status"].as_str(), Some("requested" | "scheduled")), "not started: {view:#}");
    assert!(!spans(&log).contains_key(&id(&waiting)), "the waiting run did not start");

    // a renewal lands again: healthy, and the waiting run is taken
    std::fs::remove_dir(&next).unwrap();
    wait_for("the worker to report itself healthy again", DEADLINE, || async {
        (health().await == "healthy").then_some(())
    })
    .await;
    let chain = system.wait_chain(id(&waiting), DEADLINE).await;
    assert_eq!(chain.len(), 1, "{chain:#?}");
    assert_eq!(chain[0]["status"], "completed", "{chain:#?}");
    let worker = system.log(&name);
    assert!(worker.contains("the lease file cannot be renewed"), "{worker}");
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}
