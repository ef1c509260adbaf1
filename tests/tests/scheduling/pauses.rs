//! Pause and resume against the real binaries: a paused runtime's or action's requests wait,
//! neither run nor fail (a request no worker could take, submitted beside them, fails as
//! `worker_unavailable` meanwhile), and run after the resume with no retry spent.

use std::time::Duration;

use attune_testkit::{System, TempPack, wait_for};
use serde_json::{Value, json};

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

async fn put(system: &System, path: &str, body: Value) -> (u16, Value) {
    system.request(reqwest::Method::PUT, path, Some(&body), Some(&system.token)).await
}

async fn delete(system: &System, path: &str) -> (u16, Value) {
    system.request(reqwest::Method::DELETE, path, None, Some(&system.token)).await
}

async fn row(system: &System, id: i64) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status::text, retry_count, failure_kind::text FROM execution WHERE id = $1")
        .bind(id)
        .fetch_one(&system.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_work_waits_without_failing_and_runs_after_the_resume() {
    // a second python action: no worker offers python
    let pack = TempPack::new(
        "py",
        &[
            ("other.yaml", "name: other\nruntime: python\nentrypoint: actions/other.py\n"),
            ("other.py", "print('never')\n"),
        ],
    );
    let system = System::builder()
        .pack(pack.path())
        .env("ATTUNE_WORKER_WAIT_SECS", "1")
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin")])
        .start()
        .await;
    let (status, paused) = put(&system, "/api/v1/pauses/runtime/shell", json!({"reason": "disk swap"})).await;
    assert_eq!(status, 201, "{paused}");
    assert_eq!((paused["reason"].as_str(), paused["paused_by_name"].as_str()), (Some("disk swap"), Some("test")));
    let (status, again) = put(&system, "/api/v1/pauses/runtime/shell", json!({"reason": "disk swap, day 2"})).await;
    assert_eq!((status, &again["paused_at"]), (200, &paused["paused_at"]), "{again}");
    for (path, body, code, parameter) in [
        ("/api/v1/pauses/action/core.nope", json!({"reason": "x"}), 404, None),
        ("/api/v1/pauses/host/db1", json!({"reason": "x"}), 422, Some("kind")),
        ("/api/v1/pauses/runtime/shel", json!({"reason": "x"}), 422, Some("name")),
        ("/api/v1/pauses/runtime/shell", json!({"reason": " "}), 422, Some("reason")),
    ] {
        let (status, answer) = put(&system, path, body).await;
        assert_eq!((status, answer["error"]["parameter"].as_str()), (code, parameter), "{path}: {answer}");
    }

    // the paused runtime's request waits; one no worker offers fails meanwhile; others run
    let echo = id(&system.submit("core.echo", json!({"message": "after the swap"})).await);
    let python = id(&system.submit("core.python_echo", json!({"message": "nobody"})).await);
    let noop = id(&system.submit("core.noop", json!({})).await);
    let failed = system.wait_terminal(python, Duration::from_secs(30)).await;
    assert_eq!(failed["failure_kind"], "worker_unavailable", "{failed}");
    assert_eq!(system.wait_terminal(noop, Duration::from_secs(30)).await["status"], "completed");
    assert_eq!(row(&system, echo).await, ("requested".into(), 0, None), "paused work neither runs nor fails");
    let (_, pauses) = system.get("/api/v1/pauses").await;
    assert_eq!(pauses.as_array().unwrap().len(), 1, "{pauses}");

    // a paused action's request is not failed for want of a worker: its unpaused neighbour in the
    // same runtime, submitted with it, is
    let (status, _) = put(&system, "/api/v1/pauses/action/core.python_echo", json!({"reason": "no interpreter"})).await;
    assert_eq!(status, 201);
    let paused_python = id(&system.submit("core.python_echo", json!({"message": "waits"})).await);
    let other = id(&system.submit("py.other", json!({})).await);
    let failed = system.wait_terminal(other, Duration::from_secs(30)).await;
    assert_eq!(failed["failure_kind"], "worker_unavailable", "{failed}");
    assert_eq!(row(&system, paused_python).await, ("requested".into(), 0, None), "a paused request failed");
    assert_eq!(delete(&system, "/api/v1/pauses/action/core.python_echo").await.0, 200);

    // an action paused alone; the runtime resumed
    let (status, _) = put(&system, "/api/v1/pauses/action/core.noop", json!({"reason": "noisy"})).await;
    assert_eq!(status, 201);
    let held = id(&system.submit("core.noop", json!({})).await);
    let (status, resumed) = delete(&system, "/api/v1/pauses/runtime/shell").await;
    assert_eq!((status, resumed["reason"].as_str()), (200, Some("disk swap, day 2")), "{resumed}");
    let done = system.wait_terminal(echo, Duration::from_secs(30)).await;
    assert_eq!((done["status"].as_str(), done["retry_count"].as_i64()), (Some("completed"), Some(0)), "{done}");
    assert_eq!(row(&system, held).await.0, "requested", "the paused action's request ran");
    let (status, _) = delete(&system, "/api/v1/pauses/action/core.noop").await;
    assert_eq!(status, 200);
    let done = system.wait_terminal(held, Duration::from_secs(30)).await;
    assert_eq!((done["status"].as_str(), done["retry_count"].as_i64()), (Some("completed"), Some(0)), "{done}");
    let (status, answer) = delete(&system, "/api/v1/pauses/action/core.noop").await;
    assert_eq!(status, 404, "{answer}");

    // who paused what and why is in the audit trail
    let (_, trail) = system.get("/api/v1/audit?route=/api/v1/pauses/%7Bkind%7D/%7Bname%7D&limit=100").await;
    let reasons: Vec<&str> = trail["events"].as_array().unwrap().iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.contains(&"disk swap") && reasons.contains(&"noisy"), "{trail}");

    // the CLI
    let attune = |args: &[&str]| system.attune(args);
    let out = attune(&["pause", "runtime", "builtin"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--reason"), "{out:?}");
    assert!(attune(&["pause", "runtime", "builtin", "--reason", "upgrade"]).status.success());
    let listed = String::from_utf8(attune(&["pauses"]).stdout).unwrap();
    assert!(listed.starts_with("KIND") && listed.contains("builtin") && listed.contains("upgrade"), "{listed}");
    assert!(attune(&["resume", "runtime", "builtin"]).status.success());
    wait_for("no pause left", Duration::from_secs(5), || async {
        let (_, pauses) = system.get("/api/v1/pauses").await;
        pauses.as_array().is_some_and(|p| p.is_empty()).then_some(())
    })
    .await;
    system.stop().await;
}

/// Issue 46: a pause holds what a worker already holds. With one run slot and a look-ahead, the
/// worker holds dispatches that wait for the slot; pausing the action hands them back (no retry
/// spent) in the pause's own transaction, so none of them starts after the pause answered, and
/// they run after the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_the_dispatches_a_worker_already_holds() {
    let pack = attune_testkit::runs::ticks_pack("slow", 0, 2);
    let log = std::env::temp_dir().join(format!("attune-pause-{:016x}.log", rand::random::<u64>()));
    let system = System::builder()
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell"), ("ATTUNE_WORKER_CONCURRENCY", "1")])
        .start()
        .await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(id(&system.submit("slow.run", json!({"log": log.display().to_string(), "seconds": 2})).await));
    }
    let spans = |log: &std::path::Path| attune_testkit::runs::spans(log);
    wait_for("the first run to start and the worker to hold more", Duration::from_secs(30), || async {
        let held: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE status = 'scheduled'")
            .fetch_one(&system.db.pool)
            .await
            .ok()?;
        (!spans(&log).is_empty() && held >= 1).then_some(())
    })
    .await;
    let (status, _) = put(&system, "/api/v1/pauses/action/slow.run", json!({"reason": "hold"})).await;
    assert_eq!(status, 201);
    let paused_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i128;
    let scheduled: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE status = 'scheduled'")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(scheduled, 0, "the pause's answer came with dispatched work still scheduled");
    // what ran when the pause answered ends; nothing else starts (with one slot of 2 s runs, a
    // held dispatch would have started within 2 s)
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started_after: Vec<i64> =
        spans(&log).into_iter().filter(|(_, (start, _))| *start > paused_at).map(|(id, _)| id).collect();
    assert!(started_after.is_empty(), "started after the pause answered: {started_after:?}");
    let waiting = ids.len() - spans(&log).len();
    assert!(waiting >= 4, "{waiting} of 6 wait");
    for &waiting in ids.iter().filter(|id| !spans(&log).contains_key(id)) {
        assert_eq!(row(&system, waiting).await, ("requested".into(), 0, None), "held work is handed back");
    }
    assert_eq!(delete(&system, "/api/v1/pauses/action/slow.run").await.0, 200);
    for &id in &ids {
        let done = system.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!((done["status"].as_str(), done["retry_count"].as_i64()), (Some("completed"), Some(0)), "{done}");
    }
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}
