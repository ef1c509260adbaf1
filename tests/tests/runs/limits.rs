//! Resource limits of actions, with the real binaries: an action that takes more memory or CPU
//! time than its `limits:` allow (or, without them, than the worker's `ATTUNE_ACTION_*` defaults)
//! is killed and fails as `resource_limit`, naming the limit; the worker is not blamed (its health
//! stays healthy) and runs the next execution; a worker's maximum caps what an action asks; an
//! action with too few file descriptors fails with its own error; `output_kb` only cuts output.

use std::time::{Duration, Instant};

use attune_testkit::{System, TempPack};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// A worker name no other test uses (broker connections are named after it).
fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// Allocates `mb` MiB in 4 MiB steps, each written (so resident), about 800 MiB/s at most.
const HOG_PY: &str = r#"import json, sys, time
params = json.load(sys.stdin)
chunks = []
for _ in range(params["mb"] // 4):
    chunks.append(b"\x01" * (4 << 20))
    time.sleep(0.005)
print(json.dumps({"allocated_mb": 4 * len(chunks)}))
"#;

const HOG: &str = "name: hog
runtime: python
entrypoint: actions/hog.py
timeout_seconds: 60
parameters:
  mb: {type: integer, default: 2048}
limits:
  memory_mb: 128
";

/// A busy loop in the action's own shell (no child process).
const SPIN: &str = "name: spin
runtime: shell
entrypoint: actions/spin.sh
timeout_seconds: 60
limits: {cpu_secs: 1}
";

/// Opens `count` files and keeps them open.
const FILES_PY: &str = r#"import json, os, sys
params = json.load(sys.stdin)
kept = [open(os.devnull) for _ in range(params["count"])]
print(json.dumps({"opened": len(kept)}))
"#;

const OPEN_FILES: &str = "name: files
runtime: python
entrypoint: actions/files.py
timeout_seconds: 30
parameters:
  count: {type: integer, default: 64}
limits:
  open_files: 16
";

/// 5000 numbered lines on stdout, with 1 KiB of output kept.
const CHATTY: &str = "name: chatty
runtime: shell
entrypoint: actions/chatty.sh
timeout_seconds: 30
limits: {output_kb: 1}
";

const FILES: [(&str, &str); 8] = [
    ("hog.py", HOG_PY),
    ("hog.yaml", HOG),
    ("spin.sh", "while :; do :; done\n"),
    ("spin.yaml", SPIN),
    ("files.py", FILES_PY),
    ("files.yaml", OPEN_FILES),
    ("chatty.sh", "i=0; while [ $i -lt 5000 ]; do echo line-$i; i=$((i+1)); done\n"),
    ("chatty.yaml", CHATTY),
];

/// Submits and waits for the end; asserts a `resource_limit` failure whose error contains
/// `names` and that is not retried, and returns the execution.
async fn fails_on_a_limit(system: &System, action_ref: &str, parameters: Value, names: &str) -> Value {
    let submitted = system.submit(action_ref, parameters).await;
    let started = Instant::now();
    let ended = system.wait_terminal(id(&submitted), DEADLINE).await;
    eprintln!("{action_ref} ended after {:?}: {}", started.elapsed(), ended["error"]);
    assert_eq!(
        (ended["status"].as_str(), ended["failure_kind"].as_str()),
        (Some("failed"), Some("resource_limit")),
        "{ended:#}"
    );
    let error = ended["error"].as_str().unwrap();
    assert!(error.contains(names), "the error names the limit ({names}): {error}");
    let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&submitted))).await;
    assert_eq!(view["retried_by"], Value::Null, "a limit is not retried by default: {view}");
    ended
}

/// The worker was not blamed: no failure counted against it, healthy, and it runs the next one.
async fn worker_stays_healthy(system: &System, worker: &str) {
    system.wait_worker_reports(worker, &json!({"consecutive_failures": 0, "failed_executions": 0})).await;
    let done = system.submit("core.echo", json!({"message": "still here"})).await;
    let ended = system.wait_terminal(id(&done), DEADLINE).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");
    assert_eq!(ended["worker"], system.worker_id(worker).await, "the same worker ran it");
    system.wait_worker_health(worker, "healthy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_over_its_memory_limit_fails_as_resource_limit_and_the_worker_stays_healthy() {
    let pack = TempPack::new("limits", &FILES);
    let worker = unique_name("memory");
    let system = System::builder().worker(&worker, &[]).pack(pack.path()).start().await;
    // 2 GiB asked, 128 MiB allowed: killed on the way, long before the host notices
    let ended = fails_on_a_limit(&system, "limits.hog", json!({"mb": 2048}), "memory limit 128 MiB exceeded").await;
    let error = ended["error"].as_str().unwrap();
    let resident: u64 = error.split("resident ").nth(1).and_then(|r| r.split(' ').next()?.parse().ok()).unwrap();
    assert!((128..1024).contains(&resident), "killed soon after it passed the limit: {error}");
    worker_stays_healthy(&system, &worker).await;
    // under its limit the same action completes
    let small = system.submit("limits.hog", json!({"mb": 32})).await;
    let ended = system.wait_terminal(id(&small), DEADLINE).await;
    assert_eq!((ended["status"].as_str(), &ended["result"]), (Some("completed"), &json!({"allocated_mb": 32})));
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_default_applies_and_its_maximum_caps_what_an_action_asks() {
    let pack = TempPack::new("limits", &FILES);
    let worker = unique_name("defaults");
    let system = System::builder()
        .worker(&worker, &[("ATTUNE_ACTION_MEMORY_MB", "64"), ("ATTUNE_ACTION_MAX_MEMORY_MB", "100")])
        .pack(pack.path())
        .start()
        .await;
    // core.python_echo declares no limits: the worker's default (64 MiB) holds it
    let huge_echo = json!({"message": "x".repeat(1000), "repeat": 400_000});
    fails_on_a_limit(&system, "core.python_echo", huge_echo, "memory limit 64 MiB exceeded").await;
    // limits.hog asks for 128 MiB; this worker allows 100 at most
    fails_on_a_limit(&system, "limits.hog", json!({"mb": 2048}), "memory limit 100 MiB exceeded").await;
    worker_stays_healthy(&system, &worker).await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_time_and_open_files_are_limited_and_output_kb_only_cuts_output() {
    let pack = TempPack::new("limits", &FILES);
    let worker = unique_name("cpu-files");
    let system = System::builder().worker(&worker, &[]).pack(pack.path()).start().await;
    fails_on_a_limit(&system, "limits.spin", json!({}), "cpu time limit 1 s exceeded").await;

    // 64 files with 16 descriptors: the open fails in the action, which fails with its own error
    let files = system.submit("limits.files", json!({"count": 64})).await;
    let ended = system.wait_terminal(id(&files), DEADLINE).await;
    assert_eq!(
        (ended["status"].as_str(), ended["failure_kind"].as_str()),
        (Some("failed"), Some("action_failed")),
        "{ended:#}"
    );
    assert!(ended["stderr"].as_str().unwrap().contains("Too many open files"), "{ended:#}");
    let few = system.submit("limits.files", json!({"count": 4})).await;
    assert_eq!(system.wait_terminal(id(&few), DEADLINE).await["result"], json!({"opened": 4}));

    // more output than output_kb: the tail is kept, the action still completes
    let chatty = system.submit("limits.chatty", json!({})).await;
    let ended = system.wait_terminal(id(&chatty), DEADLINE).await;
    let stdout = ended["stdout"].as_str().unwrap();
    assert_eq!(ended["status"], "completed", "{ended:#}");
    assert!(stdout.starts_with("[... ") && stdout.ends_with("line-4999\n"), "{stdout}");
    assert!(stdout.len() <= 1024 + 40, "1 KiB kept: {} bytes", stdout.len());

    worker_stays_healthy(&system, &worker).await;
    system.stop().await;
}
