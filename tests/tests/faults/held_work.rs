//! Work that has not started is never failed for where it waited, with the real binaries: a
//! worker stuck behind a long run gives back what it took ahead (another worker runs it at once),
//! losing the worker's channel fails nothing, and a request waits through the restart of the only
//! worker of its runtime (issue 31).

use std::time::{Duration, Instant};

use attune_testkit::{Started, System, close_broker_connections, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);
const SIGTERM: i32 = 15;

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// A worker name no other test uses (broker connections are named after it).
fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// The executions of `action_ref`, as (id, status, worker, failure kind, retry count).
async fn executions_of(system: &System, action_ref: &str) -> Vec<(i64, String, Option<i64>, Option<String>, i32)> {
    sqlx::query_as(
        "SELECT id, status::text, worker, failure_kind::text, retry_count FROM execution WHERE action_ref = $1 \
         ORDER BY id",
    )
    .bind(action_ref)
    .fetch_all(&system.db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stuck_behind_a_long_run_gives_back_what_it_took_ahead_and_a_lost_channel_fails_nothing() {
    let (stuck, idle) = (unique_name("stuck"), unique_name("idle"));
    let system = System::builder()
        .env("ATTUNE_WORKER_QUEUE_TTL_SECS", "20")
        .worker(&stuck, &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin"), ("ATTUNE_WORKER_CONCURRENCY", "1")])
        .worker(&idle, &[("ATTUNE_WORKER_RUNTIMES", "builtin"), ("ATTUNE_WORKER_CONCURRENCY", "1")])
        .start()
        .await;
    let (stuck_id, idle_id) = (system.worker_id(&stuck).await, system.worker_id(&idle).await);
    // quick runs first (only the stuck worker offers shell): its look-ahead grows
    for n in 0..5 {
        let echo = system.submit("core.echo", json!({"message": format!("warm {n}")})).await;
        assert_eq!(system.wait_terminal(id(&echo), DEADLINE).await["status"], "completed");
    }
    wait_for("the stuck worker to take 16 ahead", DEADLINE, || async {
        let (_, workers) = system.get("/api/v1/workers").await;
        let found = workers.as_array()?.iter().find(|w| w["name"] == stuck.as_str())?.clone();
        (found["capabilities"]["prefetch"] == 16).then_some(())
    })
    .await;
    let sleep = system.submit("core.sleep", json!({"seconds": 45})).await;
    wait_for("the long run to start", DEADLINE, || async {
        let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&sleep))).await;
        (view["status"] == "running").then_some(())
    })
    .await;

    let submitted = Instant::now();
    let mut noops = Vec::new();
    for _ in 0..20 {
        noops.push(id(&system.submit("core.noop", json!({})).await));
    }
    // every one runs on the idle worker while the long run goes on: none waits for it
    for noop in &noops {
        let view = system.wait_terminal(*noop, Duration::from_secs(25)).await;
        assert_eq!(view["status"], "completed", "{view}");
        assert_eq!(view["worker"], idle_id, "{view}");
    }
    assert!(submitted.elapsed() < Duration::from_secs(25), "{:?}", submitted.elapsed());
    let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&sleep))).await;
    assert_eq!(view["status"], "running", "the long run still goes on: {view}");

    // a second wave while the stuck worker's consumer connection is lost: nothing of it fails
    // unrun (nothing is held by a worker that cannot start it, and what a lost channel held goes
    // back to waiting)
    let mut wave = Vec::new();
    for _ in 0..10 {
        wave.push(id(&system.submit("core.noop", json!({})).await));
    }
    assert_eq!(close_broker_connections(&format!("attune-worker-{stuck}-consumer")), 1);
    for noop in &wave {
        let view = system.wait_terminal(*noop, DEADLINE).await;
        assert_eq!(view["status"], "completed", "{view}");
    }
    let noop_runs = executions_of(&system, "core.noop").await;
    assert_eq!(noop_runs.len(), 30, "no retry was needed: {noop_runs:?}");
    for (execution, status, worker, failure_kind, retry_count) in &noop_runs {
        assert_eq!((status.as_str(), failure_kind, retry_count), ("completed", &None, &0), "{execution}");
        assert_ne!(*worker, Some(stuck_id), "{execution} ran behind the long run");
    }
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_through_the_restart_of_the_only_worker_of_their_runtime() {
    let only = unique_name("only");
    let env = [("ATTUNE_WORKER_RUNTIMES", "shell"), ("ATTUNE_WORKER_CONCURRENCY", "1")];
    let mut system = System::builder()
        // a short wait for a worker: the restart below takes longer than it
        .env("ATTUNE_WORKER_WAIT_SECS", "6")
        .worker(&only, &env)
        .start()
        .await;
    let sleep = system.submit("core.sleep", json!({"seconds": 15})).await;
    wait_for("the long run to start", DEADLINE, || async {
        let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&sleep))).await;
        (view["status"] == "running").then_some(())
    })
    .await;
    let mut echoes = Vec::new();
    for n in 0..5 {
        echoes.push(id(&system.submit("core.echo", json!({"message": format!("behind {n}")})).await));
    }
    // the worker drains (until its run ends: longer than the wait) and exits; it comes back 2 s
    // later
    let stopping = Instant::now();
    system.signal(&only, SIGTERM);
    assert!(stopping.elapsed() > Duration::from_secs(6), "the drain outlasted the wait: {:?}", stopping.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    system.restart_with(&only, &env);
    for echo in &echoes {
        let view = system.wait_terminal(*echo, DEADLINE).await;
        assert_eq!((view["status"].as_str(), view["retry_count"].as_i64()), (Some("completed"), Some(0)), "{view}");
    }
    assert_eq!(system.wait_terminal(id(&sleep), DEADLINE).await["status"], "completed");
    let echo_runs = executions_of(&system, "core.echo").await;
    assert_eq!(echo_runs.len(), 5, "nothing failed, nothing retried: {echo_runs:?}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_claimed_and_never_sent_waits_again_within_seconds() {
    let system = System::builder().worker("w", &[]).start().await;
    let worker = system.worker_id("w").await;
    // what an executor killed between its claim and its publish leaves: the execution scheduled
    // on a live worker, and no message for it anywhere (it is written delayed, far off, so that
    // no scheduler takes it first)
    let action = attune_common::db::action::get_by_ref(&system.db.pool, "core.echo").await.unwrap().unwrap();
    let new = attune_common::db::execution::NewExecution {
        runtime: Some(action.runtime.clone()),
        status: attune_core::ExecutionStatus::Delayed,
        not_before: Some(chrono::Utc::now() + chrono::Duration::days(1)),
        ..attune_testkit::echo_execution(&action)
    };
    let stranded = attune_common::db::execution::insert(&system.db.pool, &new).await.unwrap().id;
    attune_testkit::force_status(&system.db.pool, stranded, attune_core::ExecutionStatus::Scheduled, Some(worker))
        .await;
    // the worker's heartbeats (every second here) do not mark it held; the monitor (every 5 s)
    // hands it back, long before the queue TTL and grace (330 s)
    let view = system.wait_terminal(stranded, Duration::from_secs(25)).await;
    assert_eq!((view["status"].as_str(), view["retry_count"].as_i64()), (Some("completed"), Some(0)), "{view}");
    assert!(system.log("executor").contains("dispatch lost before it started"), "the monitor handed it back");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_executors_never_place_more_on_a_worker_than_its_slots() {
    // one slot: one run at once, nothing taken ahead
    let system = System::builder()
        .worker("w", &[("ATTUNE_WORKER_CONCURRENCY", "1"), ("ATTUNE_WORKER_PREFETCH", "0")])
        .start()
        .await;
    let worker = system.worker_id("w").await;
    let second_log = std::env::temp_dir().join(format!("attune-second-executor-{:016x}.log", rand::random::<u64>()));
    let output = std::fs::File::create(&second_log).unwrap();
    let second = system
        .command("attune-executor")
        .stdin(std::process::Stdio::null())
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .spawn()
        .unwrap();
    // (stopped however the test ends)
    let _second = Started(second);
    wait_for("the second executor to consume", DEADLINE, || async {
        std::fs::read_to_string(&second_log).unwrap_or_default().contains("consuming").then_some(())
    })
    .await;
    let placed = |log: &str| log.lines().filter(|line| line.contains("dispatched")).count();
    // waves of 20 until both executors have placed work (the test would prove nothing with one)
    let mut most = 0;
    let mut all = Vec::new();
    for wave in 0..3 {
        let mut ids = Vec::new();
        for n in 0..20 {
            ids.push(id(&system.submit("core.echo", json!({"message": format!("one at a time {wave}.{n}")})).await));
        }
        // what is dispatched to the worker and unfinished, sampled until every one has finished
        let started = Instant::now();
        loop {
            let (inflight, unfinished): (i64, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE worker = $1 AND status IN ('scheduled', 'running')), \
                        count(*) FILTER (WHERE status NOT IN ('completed', 'failed', 'timeout', 'canceled', 'abandoned')) \
                 FROM execution WHERE id = ANY($2)",
            )
            .bind(worker)
            .bind(&ids)
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
            most = most.max(inflight);
            if unfinished == 0 {
                break;
            }
            assert!(started.elapsed() < DEADLINE, "{unfinished} still unfinished");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        all.extend(ids);
        let (first, other) = (placed(&system.log("executor")), placed(&std::fs::read_to_string(&second_log).unwrap()));
        if first > 0 && other > 0 {
            break;
        }
        assert!(wave < 2, "three waves and one executor placed everything: {first} and {other} dispatches");
    }
    assert_eq!(most, 1, "the worker has one slot");
    for execution in all {
        assert_eq!(system.wait_terminal(execution, DEADLINE).await["status"], "completed");
    }
    let _ = std::fs::remove_file(&second_log);
    system.stop().await;
}

/// `GET /executions/{id}`'s `waiting`, once it says `reason`.
async fn waiting_for(system: &System, id: i64, reason: &str) -> Value {
    wait_for(&format!("execution {id} to wait for {reason}"), DEADLINE, || async move {
        let (_, view) = system.get(&format!("/api/v1/executions/{id}")).await;
        (view["waiting"]["reason"] == reason).then_some(view["waiting"].clone())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_says_why_an_execution_waits() {
    let system = System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "30")
        .worker(
            "w1",
            &[("ATTUNE_WORKER_RUNTIMES", "shell"), ("ATTUNE_WORKER_CONCURRENCY", "1"), ("ATTUNE_WORKER_PREFETCH", "0")],
        )
        .start()
        .await;
    system.wait_consuming("w1").await;
    let owned = system;
    let system = &owned;
    let submit = |action: &'static str, parameters: Value| async move {
        system.submit(action, parameters).await["id"].as_i64().unwrap()
    };

    // no worker offers python: said by the API, and by `run --wait` before it gives up
    let python = submit("core.python_echo", json!({"message": "hi"})).await;
    let why = waiting_for(system, python, "no_worker").await;
    assert!(why["message"].as_str().unwrap().contains("no healthy or degraded worker offers python"), "{why}");
    let out = system.cli_output(&["run", "core.python_echo", "message=again", "--wait", "--wait-timeout", "2"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("waits: no healthy or degraded worker offers python"), "{said}");
    assert!(said.contains("still requested after 2s: no healthy"), "{said}");

    // a retry waits out its backoff
    let flaky = submit("core.flaky", json!({"fail_times": 1})).await;
    let retry = wait_for("the flaky run's retry", DEADLINE, || async move {
        let (_, view) = system.get(&format!("/api/v1/executions/{flaky}")).await;
        view["retried_by"].as_i64()
    })
    .await;
    let why = waiting_for(system, retry, "backoff").await;
    assert!(why["until"].is_string() && why["message"].as_str().unwrap().contains("backoff"), "{why}");
    system
        .request(reqwest::Method::POST, &format!("/api/v1/executions/{retry}/cancel"), None, Some(&system.token))
        .await;

    // one sleep runs; a second is held by the action's concurrency limit, naming the first
    let (status, set) = system
        .request(
            reqwest::Method::PUT,
            "/api/v1/actions/core.sleep/concurrency",
            Some(&json!({"limit": 1, "reason": "one at a time"})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 200, "{set}");
    let first = submit("core.sleep", json!({"seconds": 60})).await;
    wait_for("the first sleep to run", DEADLINE, || async move {
        let (_, view) = system.get(&format!("/api/v1/executions/{first}")).await;
        (view["status"] == "running").then_some(())
    })
    .await;
    let second = submit("core.sleep", json!({"seconds": 1})).await;
    let why = waiting_for(system, second, "concurrency").await;
    assert_eq!((why["limit"].as_i64(), &why["held_by"]), (Some(1), &json!([first])), "{why}");

    // the only shell worker's one slot is taken: an echo waits for it, in every view
    let echo = submit("core.echo", json!({"message": "later"})).await;
    let why = waiting_for(system, echo, "workers_full").await;
    assert!(why["message"].as_str().unwrap().contains("every worker offering shell is full"), "{why}");
    let shown = system.cli_output(&["execution", "get", &echo.to_string()]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("waiting") && shown.contains("every worker offering shell is full"), "{shown}");
    let mut stream = system
        .http
        .get(format!("{}/api/v1/executions/{echo}/output", system.api_url))
        .bearer_auth(&system.token)
        .send()
        .await
        .unwrap();
    let first_chunk = tokio::time::timeout(DEADLINE, stream.chunk()).await.unwrap().unwrap().unwrap();
    let first_chunk = String::from_utf8_lossy(&first_chunk);
    assert!(first_chunk.contains("event: waiting") && first_chunk.contains("workers_full"), "{first_chunk}");
    drop(stream);

    // a paused action's run says who paused it and why
    let (status, paused) = system
        .request(
            reqwest::Method::PUT,
            "/api/v1/pauses/action/core.fail",
            Some(&json!({"reason": "a bad deploy"})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 201, "{paused}");
    let held = submit("core.fail", json!({})).await;
    let why = waiting_for(system, held, "paused").await;
    assert_eq!((why["why"].as_str(), why["kind"].as_str()), (Some("a bad deploy"), Some("action")), "{why}");
    assert!(why["paused_by_name"].is_string(), "{why}");

    // once it runs, nothing is said
    system
        .request(reqwest::Method::POST, &format!("/api/v1/executions/{first}/cancel"), None, Some(&system.token))
        .await;
    let done = system.wait_terminal(echo, DEADLINE).await;
    assert_eq!(done["waiting"], Value::Null, "{done}");
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_is_given_nothing_new_until_undrained() {
    // (the executors read the fleet afresh at every look: a drain is seen by the next)
    let system = System::builder().env("ATTUNE_WORKER_CACHE_MS", "0").worker("w1", &[]).worker("w2", &[]).start().await;
    system.wait_consuming("w1").await;
    system.wait_consuming("w2").await;
    let w1 = system.worker_id("w1").await;
    let out = system.cli_output(&["worker", "drain", "w1"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("worker w1 drained"), "{out:?}");
    let listed = system.cli_output(&["worker", "list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).lines().any(|l| l.contains("w1") && l.contains("(drained)")));
    let mut ran_on = Vec::new();
    for n in 0..8 {
        let made = system.submit("core.echo", json!({"message": format!("drained {n}")})).await;
        let done = system.wait_terminal(made["id"].as_i64().unwrap(), DEADLINE).await;
        ran_on.push(done["worker"].as_i64().unwrap());
    }
    assert!(!ran_on.contains(&w1), "a drained worker was given work: {ran_on:?}");
    // undrained, it is given work again
    let out = system.cli_output(&["worker", "undrain", "w1"]);
    assert!(out.status.success(), "{out:?}");
    let owned = system;
    let system = &owned;
    wait_for("w1 to be given work again", DEADLINE, || async move {
        let made = system.submit("core.echo", json!({"message": "again"})).await;
        let done = system.wait_terminal(made["id"].as_i64().unwrap(), DEADLINE).await;
        (done["worker"].as_i64() == Some(w1)).then_some(())
    })
    .await;
    owned.stop().await;
}
