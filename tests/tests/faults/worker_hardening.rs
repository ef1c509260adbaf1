//! Workers that outside input cannot break, with the real binaries: an action never outlives its
//! worker, oversized parameters are refused at the door (and what still cannot start is the
//! request's fault, not the worker's), an unhealthy worker comes back after its probation, a
//! cancel always stops the run (also when its notice is lost), and a worker name belongs to one
//! live process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use attune_testkit::runs::{KillOnDrop, processes_with_env};
use attune_testkit::system::repo_root;
use attune_testkit::{System, close_broker_connections, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);
const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// A worker name no other test uses (broker connections are named after it).
fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

fn with_e2e() -> attune_testkit::SystemBuilder {
    System::builder().pack(repo_root().join("testkit/packs/e2e"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_and_its_grandchildren_die_with_their_worker() {
    let name = unique_name("orphans");
    let mut system = with_e2e().worker(&name, &[]).start().await;
    let marker = format!("marker-{:016x}", rand::random::<u64>());
    let entry = format!("ATTUNE_PARAM_MARKER={marker}");
    let _cleanup = KillOnDrop(entry.clone());
    system.submit("e2e.spawn", json!({"marker": marker})).await;
    // the script's shell, its background grandchild and its foreground sleep
    wait_for("the action and its grandchild to run", DEADLINE, || async {
        (processes_with_env(&entry).len() >= 3).then_some(())
    })
    .await;
    system.signal(&name, SIGKILL);
    let killed = Instant::now();
    wait_for("every process of the action to be gone within 2 s", Duration::from_secs(2), || async {
        processes_with_env(&entry).is_empty().then_some(())
    })
    .await;
    eprintln!("the action's processes were gone {:?} after the worker was killed", killed.elapsed());
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_parameters_are_refused_at_the_door_and_the_worker_stays_healthy() {
    let name = unique_name("oversized");
    let system = System::builder().worker(&name, &[]).start().await;
    let huge = "x".repeat(200 * 1024);
    for _ in 0..12 {
        let (status, body) = system
            .post("/api/v1/executions", &json!({"action_ref": "core.echo", "parameters": {"message": huge}}))
            .await;
        assert!(status == 413 || status == 422, "{status}: {}", &body.to_string()[..200.min(body.to_string().len())]);
        assert_eq!(body["error"]["parameter"], "parameters.message", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("ATTUNE_API_MAX_PARAMETER"), "the message names the limit's setting: {message}");
    }
    let (status, body) = system
        .post(
            "/api/v1/executions",
            &json!({"action_ref": "core.echo", "parameters": {"message": "y".repeat(30 * 1024)}}),
        )
        .await;
    assert_eq!(status, 201, "30 KiB is within the default limits: {body}");
    let refused: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE length(parameters::text) > 100000")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(refused, 0, "nothing oversized was stored");
    let done = system.submit("core.echo", json!({"message": "still fine"})).await;
    assert_eq!(system.wait_terminal(id(&done), DEADLINE).await["status"], "completed");
    system.wait_worker_reports(&name, &json!({"consecutive_failures": 0, "failed_executions": 0})).await;
    system.wait_worker_health(&name, "healthy").await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_start_because_of_the_request_is_the_requests_fault() {
    // limits raised past what the operating system takes in one environment variable (128 KiB):
    // the worker cannot start the action, and that is the request's fault, not the worker's
    let name = unique_name("e2big");
    let system = System::builder()
        .env("ATTUNE_API_MAX_PARAMETERS_BYTES", "1048576")
        .env("ATTUNE_API_MAX_PARAMETER_VALUE_BYTES", "1048576")
        .worker(&name, &[])
        .start()
        .await;
    let huge = "x".repeat(200 * 1024);
    for _ in 0..12 {
        let submitted = system.submit("core.echo", json!({"message": huge})).await;
        let ended = system.wait_terminal(id(&submitted), DEADLINE).await;
        assert_eq!(
            (ended["status"].as_str(), ended["failure_kind"].as_str()),
            (Some("failed"), Some("invalid_parameters"))
        );
        let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&submitted))).await;
        assert_eq!(view["retried_by"], Value::Null, "the request's fault is not retried: {view}");
    }
    system.wait_worker_reports(&name, &json!({"consecutive_failures": 0, "failed_executions": 0})).await;
    let done = system.submit("core.echo", json!({"message": "still fine"})).await;
    assert_eq!(system.wait_terminal(id(&done), DEADLINE).await["status"], "completed");
    system.wait_worker_health(&name, "healthy").await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_worker_gets_a_probe_after_its_probation_and_comes_back() {
    let name = unique_name("probation");
    let system = System::builder()
        .env("ATTUNE_HEALTH_PROBATION_SECS", "2")
        .env("ATTUNE_WORKER_WAIT_SECS", "60")
        .worker(&name, &[])
        .pack(repo_root().join("testkit/packs/e2e"))
        .start()
        .await;
    // the pack as registered: the system's copy in its packs directory
    let pack = system.packs_dir().join("e2e");
    let moved = pack.with_extension("moved");
    let log = std::env::temp_dir().join(format!("attune-probation-{:08x}.log", rand::random::<u32>()));
    let parameters = json!({"log": log, "seconds": 0});
    // the worker's own failure: its pack directory is gone
    std::fs::rename(&pack, &moved).unwrap();
    for _ in 0..10 {
        let submitted = system.submit("e2e.steps", parameters.clone()).await;
        let ended = system.wait_terminal(id(&submitted), DEADLINE).await;
        assert_eq!(ended["failure_kind"], "action_not_found", "{ended}");
    }
    system.wait_worker_health(&name, "unhealthy").await;
    std::fs::rename(&moved, &pack).unwrap();
    let probe = system.submit("e2e.steps", parameters.clone()).await;
    let ended = system.wait_terminal(id(&probe), DEADLINE).await;
    assert_eq!(ended["status"], "completed", "the probe after the probation ran: {ended}");
    system.wait_worker_health(&name, "healthy").await;
    // and it takes ordinary work again, several at once
    let mut more = Vec::new();
    for _ in 0..5 {
        more.push(id(&system.submit("e2e.steps", parameters.clone()).await));
    }
    for execution in more {
        assert_eq!(system.wait_terminal(execution, DEADLINE).await["status"], "completed");
    }
    system.stop().await;
    let _ = std::fs::remove_file(&log);
}

/// The ids with a start line and the ids with an end line in a `e2e.steps` log.
fn steps_log(path: &Path) -> (Vec<i64>, Vec<i64>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let ids = |kind: &str| -> Vec<i64> {
        text.lines().filter_map(|l| l.strip_prefix(kind)).filter_map(|id| id.trim().parse().ok()).collect()
    };
    (ids("start "), ids("end "))
}

async fn cancel(system: &System, execution: i64) {
    let (status, body) = system.post(&format!("/api/v1/executions/{execution}/cancel"), &json!({})).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("canceled")), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_always_stops_the_run_even_when_its_notice_is_lost() {
    let name = unique_name("cancel");
    let mut system = with_e2e()
        .env("ATTUNE_WORKER_CANCEL_CHECK_SECS", "1")
        .worker(&name, &[("ATTUNE_WORKER_CONCURRENCY", "6")])
        .start()
        .await;
    let log: PathBuf = std::env::temp_dir().join(format!("attune-cancel-{:08x}.log", rand::random::<u32>()));
    let entry = format!("ATTUNE_PARAM_LOG={}", log.display());
    let _cleanup = KillOnDrop(entry.clone());

    // 30 cancels at random moments between the submission and the first seconds of the run
    let cancels = (0..30).map(|_| {
        let (system, log) = (&system, log.clone());
        async move {
            let submitted = system.submit("e2e.steps", json!({"log": log, "seconds": 10})).await;
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..2500))).await;
            cancel(system, id(&submitted)).await;
            id(&submitted)
        }
    });
    let ids = futures_util::future::join_all(cancels).await;
    wait_for("every canceled action's processes to be gone", Duration::from_secs(15), || async {
        processes_with_env(&entry).is_empty().then_some(())
    })
    .await;
    let (started, ended) = steps_log(&log);
    assert!(!started.is_empty(), "some were canceled while running");
    assert_eq!(ended, Vec::<i64>::new(), "no canceled execution ran to its end");
    for execution in ids {
        let (_, view) = system.get(&format!("/api/v1/executions/{execution}")).await;
        assert_eq!(view["status"], "canceled", "{view}");
    }

    // the notices are lost: the worker is frozen while its control connection is closed, and
    // the cancels come before it can consume again; it finds them in the database
    let _ = std::fs::remove_file(&log);
    let mut running = Vec::new();
    for _ in 0..4 {
        // long enough that the freeze, two rabbitmqctl calls and the cancels fit in, however slow
        running.push(id(&system.submit("e2e.steps", json!({"log": log, "seconds": 30})).await));
    }
    wait_for("four actions to start", DEADLINE, || async { (steps_log(&log).0.len() == 4).then_some(()) }).await;
    system.signal(&name, SIGSTOP);
    let closed = close_broker_connections(&format!("attune-worker-{name}-control-consumer"));
    assert_eq!(closed, 1, "the worker's control connection");
    for execution in &running {
        cancel(&system, *execution).await;
    }
    system.signal(&name, SIGCONT);
    // the database check every second, then the kill's grace: well inside the 30 s run
    wait_for("the canceled actions' processes to be gone", Duration::from_secs(15), || async {
        processes_with_env(&entry).is_empty().then_some(())
    })
    .await;
    assert_eq!(steps_log(&log).1, Vec::<i64>::new(), "no canceled execution ran to its end");
    system.wait_log(&name, "canceled in the database").await;
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}

/// One more `attune-worker` process named `name`, outside the system's own processes, its output
/// to `output()` (piped to read it, null to drop it).
fn another_worker(system: &System, name: &str, output: fn() -> std::process::Stdio) -> std::process::Child {
    system
        .command("attune-worker")
        .env("ATTUNE_WORKER_NAME", name)
        .stdin(std::process::Stdio::null())
        .stdout(output())
        .stderr(output())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_a_live_workers_name_refuses_to_start() {
    let name = unique_name("twin");
    let system = System::builder().worker(&name, &[]).start().await;
    let before: Value = sqlx::query_scalar("SELECT capabilities FROM worker WHERE name = $1")
        .bind(&name)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    let mut twin = another_worker(&system, &name, std::process::Stdio::piped);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = twin.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = twin.kill();
            let _ = twin.wait();
            panic!("a second worker named {name} started alongside the live one");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let output = twin.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains(&format!("worker '{name}' is already running")), "{stderr}");
    // the live worker is untouched and still works
    let after: Value = sqlx::query_scalar("SELECT capabilities FROM worker WHERE name = $1")
        .bind(&name)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(after["queue"], before["queue"]);
    let done = system.submit("core.echo", json!({"message": "one worker"})).await;
    assert_eq!(system.wait_terminal(id(&done), DEADLINE).await["status"], "completed");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_name_was_taken_while_it_was_frozen_stops_and_leaves_the_new_holder_alone() {
    let name = unique_name("displaced");
    let mut system = System::builder().env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "3").worker(&name, &[]).start().await;
    let pool = system.db.pool.clone();
    let holder_pid = |pool: sqlx::PgPool, name: String| async move {
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT (capabilities->'instance'->>'pid')::bigint FROM worker WHERE name = $1",
        )
        .bind(name)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let first_pid = holder_pid(pool.clone(), name.clone()).await.unwrap();
    // frozen past the heartbeat limit: its name is free for a new process
    system.signal(&name, SIGSTOP);
    wait_for("the frozen worker's heartbeat to go stale", DEADLINE, || {
        let (pool, name) = (pool.clone(), name.clone());
        async move {
            let stale: bool = sqlx::query_scalar(
                "SELECT now() - last_heartbeat > interval '3.5 seconds' FROM worker WHERE name = $1",
            )
            .bind(&name)
            .fetch_one(&pool)
            .await
            .ok()?;
            stale.then_some(())
        }
    })
    .await;
    let mut successor = another_worker(&system, &name, std::process::Stdio::null);
    let successor_pid = i64::from(successor.id());
    wait_for("the new process to hold the name", DEADLINE, || {
        let (pool, name) = (pool.clone(), name.clone());
        async move {
            let status: String = sqlx::query_scalar("SELECT status FROM worker WHERE name = $1")
                .bind(&name)
                .fetch_one(&pool)
                .await
                .ok()?;
            (holder_pid(pool, name).await == Some(successor_pid) && status == "active").then_some(())
        }
    })
    .await;
    // thawed, the old process finds its heartbeat fenced out and stops without touching the
    // row, the queue or the new holder's work
    system.signal(&name, SIGCONT);
    system.wait_log(&name, "another process took this worker's name").await;
    system.wait_log(&name, "worker stopped: its name belongs to another process now").await;
    assert_ne!(first_pid, successor_pid);
    for _ in 0..3 {
        let done = system.submit("core.echo", json!({"message": "new holder"})).await;
        assert_eq!(system.wait_terminal(id(&done), DEADLINE).await["status"], "completed");
    }
    let (status, pid): (String, Option<i64>) =
        sqlx::query_as("SELECT status, (capabilities->'instance'->>'pid')::bigint FROM worker WHERE name = $1")
            .bind(&name)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), pid), ("active", Some(successor_pid)));
    let _ = successor.kill();
    let _ = successor.wait();
    system.stop().await;
}
