//! Actions cannot reach what is not theirs (issue 32): a worker running as root (as these tests
//! do) runs each process action as a user id of its own, so that one action cannot read a
//! sibling's parameters from `/proc/<pid>/environ`, nor the worker's, nor signal the worker or
//! its own supervisor.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use attune_testkit::{System, TempPack, wait_for};
use serde_json::{Value, json};

const SLEEPER: &str = "name: sleeper
runtime: shell
entrypoint: actions/sleeper.sh
timeout_seconds: 60
parameters:
  token: {type: string, required: true}
  dir: {type: string, required: true}
";
const SLEEPER_SH: &str = r#"#!/bin/sh
echo $$ > "$ATTUNE_PARAM_DIR/sleeper.pid"
while [ ! -e "$ATTUNE_PARAM_DIR/done" ]; do sleep 0.1; done
"#;
const SNOOP: &str = "name: snoop
runtime: shell
entrypoint: actions/snoop.sh
parameters:
  pid: {type: integer, required: true}
";
// what it can learn and do, as a JSON result
const SNOOP_SH: &str = r#"#!/bin/sh
can() { if "$@" >/dev/null 2>&1; then echo true; else echo false; fi; }
worker=$(awk '{print $4}' /proc/$PPID/stat)
their_uid=$(awk '/^Uid:/ {print $2}' /proc/$ATTUNE_PARAM_PID/status)
printf '{"uid": %s, "their_uid": %s, "read_sibling_environ": %s, "read_worker_environ": %s, "signal_worker": %s, "signal_supervisor": %s, "signal_sibling": %s}\n' \
  "$(id -u)" "$their_uid" \
  "$(can grep -q ATTUNE_PARAM_TOKEN /proc/$ATTUNE_PARAM_PID/environ)" \
  "$(can cat /proc/$worker/environ)" \
  "$(can kill -0 $worker)" "$(can kill -0 $PPID)" "$(can kill -0 $ATTUNE_PARAM_PID)"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_action_runs_as_a_user_of_its_own_and_cannot_read_or_signal_the_others() {
    let pack = TempPack::new(
        "users",
        &[("sleeper.yaml", SLEEPER), ("sleeper.sh", SLEEPER_SH), ("snoop.yaml", SNOOP), ("snoop.sh", SNOOP_SH)],
    );
    // the pack as a deployment keeps it: readable by every user
    for entry in std::fs::read_dir(pack.path().join("actions")).unwrap() {
        std::fs::set_permissions(entry.unwrap().path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let system = System::builder()
        .actions_as_their_own_users()
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_CONCURRENCY", "4")])
        .start()
        .await;
    // a directory any user may write, for the sleeper's pid
    let dir = std::env::temp_dir().join(format!("attune-users-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();

    let sleeper = system
        .submit("users.sleeper", json!({"token": "sibling-secret-parameter", "dir": dir.to_str().unwrap()}))
        .await;
    let pid: i64 = wait_for("the sleeper to start", Duration::from_secs(30), || async {
        std::fs::read_to_string(dir.join("sleeper.pid")).ok()?.trim().parse().ok()
    })
    .await;
    let snoop = system.submit("users.snoop", json!({"pid": pid})).await;
    let snooped = system.wait_terminal(snoop["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(snooped["status"], "completed", "{snooped}");
    let seen = &snooped["result"];
    let (uid, their_uid) = (seen["uid"].as_u64().unwrap(), seen["their_uid"].as_u64().unwrap());
    // the worker's default range as root (attune_worker::DEFAULT_ACTION_UIDS)
    let range = 1_900_000_000u32..=1_900_065_535;
    assert!(range.contains(&(uid as u32)) && range.contains(&(their_uid as u32)), "{seen}");
    assert_ne!(uid, their_uid, "two running actions share a user id");
    for (what, expected) in [
        ("read_sibling_environ", false),
        ("read_worker_environ", false),
        ("signal_worker", false),
        ("signal_supervisor", false),
        ("signal_sibling", false),
    ] {
        assert_eq!(seen[what], Value::Bool(expected), "{what}: {seen}");
    }

    std::fs::write(dir.join("done"), "").unwrap();
    let slept = system.wait_terminal(sleeper["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(slept["status"], "completed", "{slept}");
    system.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 46: a worker whose action users cannot enter its packs directory would take every
/// process run and fail it as `action_not_found` (a black hole that stays healthy): it refuses to
/// start, naming the setting and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_action_users_cannot_enter_its_packs_refuses_to_start() {
    let mut system = System::builder().actions_as_their_own_users().start().await;
    let closed = std::env::temp_dir().join(format!("attune-closed-{:016x}", rand::random::<u64>()));
    attune_testkit::copy_dir(&system.packs_dir(), &closed);
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    system.restart_with("closed", &[("ATTUNE_PACKS_DIR", closed.to_str().unwrap())]);
    wait_for("the worker to refuse to start", Duration::from_secs(30), || {
        let exited = !system.is_running("closed");
        async move { exited.then_some(()) }
    })
    .await;
    let log = system.log("closed");
    assert!(log.contains("ATTUNE_PACKS_DIR") && log.contains("cannot enter"), "{log}");
    let registered: i64 = sqlx::query_scalar("SELECT count(*) FROM worker WHERE name = 'closed'")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(registered, 0, "it registered nothing, so nothing is placed on it");
    let _ = std::fs::remove_dir_all(&closed);
    system.stop().await;
}
