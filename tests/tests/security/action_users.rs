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
printf '{"uid": %s, "their_uid": %s, "no_new_privs": %s, "read_sibling_environ": %s, "read_worker_environ": %s, "signal_worker": %s, "signal_supervisor": %s, "signal_sibling": %s}\n' \
  "$(id -u)" "$their_uid" "$(awk '/^NoNewPrivs:/ {print $2}' /proc/self/status)" \
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
    // no set-user-id file or file capability it runs changes its ids (its end's quick sweep asks
    // the kernel about its real user alone)
    assert_eq!(seen["no_new_privs"], 1, "{seen}");
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

/// A directory any user may write, for what the actions of a test tell it.
fn shared_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("attune-{what}-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// The real and saved user ids of process `pid` while it runs (not once it is a zombie or gone).
fn live_uids(pid: i64) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if status.lines().any(|line| line.starts_with("State:") && line.contains("Z (zombie)")) {
        return None;
    }
    let ids: Vec<u32> = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .filter_map(|id| id.parse().ok())
        .collect();
    Some((*ids.first()?, *ids.get(2)?))
}

const SPY: &str = "name: spy
runtime: shell
entrypoint: actions/spy.sh
max_retries: 0
timeout_seconds: 30
parameters:
  dir: {type: string, required: true}
";
// the review's daemon (finding 2 of 2026-11-28): it leaves its group and reads the environment of
// every process of its user into a file, for as long as it lives; the action ends once it has
// seen its own environment there (so it is known to work)
const SPY_SH: &str = r#"#!/bin/sh
spy="$ATTUNE_PARAM_DIR/spy"
setsid sh -c 'echo $$ > "$0.pid"; while :; do for p in /proc/[0-9]*; do [ -O $p ] && tr "\0" "\n" <$p/environ 2>/dev/null | grep ^ATTUNE_PARAM_ >>"$0"; done; sleep 0.05; done' "$spy" </dev/null >/dev/null 2>&1 &
while [ ! -s "$spy" ]; do sleep 0.05; done
printf '{"uid": %s}\n' "$(id -u)"
"#;
const VICTIM: &str = "name: victim
runtime: shell
entrypoint: actions/victim.sh
max_retries: 0
parameters:
  api_key: {type: string, secret: true, required: true}
";
// its `sleep` carries the opened secret in its environment, and is dumpable (readable by its user)
const VICTIM_SH: &str = r#"#!/bin/sh
sleep 1
printf '{"uid": %s}\n' "$(id -u)"
"#;
const VICTIM_SECRET: &str = "victim-api-key-0123456789abcdefghij";

/// Issue 47, finding 2 of the 2026-11-28 review: user ids are taken in turn, and a process an
/// action left behind (`setsid`) read the opened secret of a later execution once its id came
/// round. Now every process of the id is killed when its run ends, before the id is used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_an_action_leaves_behind_is_gone_before_its_user_id_runs_another_action() {
    let pack = TempPack::new(
        "leftover",
        &[("spy.yaml", SPY), ("spy.sh", SPY_SH), ("victim.yaml", VICTIM), ("victim.sh", VICTIM_SH)],
    );
    // two ids: the spy's comes round at the second victim at the latest
    let system = System::builder()
        .secrets_key()
        .env("ATTUNE_WORKER_ACTION_UIDS", "70010-70011")
        .pack(pack.path())
        .worker("w1", &[])
        .start()
        .await;
    let dir = shared_dir("spy");
    let spy = system.submit("leftover.spy", json!({"dir": dir.to_str().unwrap()})).await;
    let spied = system.wait_terminal(spy["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(spied["status"], "completed", "{spied}");
    let spy_uid = spied["result"]["uid"].as_u64().unwrap() as u32;
    let daemon: i64 = std::fs::read_to_string(dir.join("spy.pid")).unwrap().trim().parse().unwrap();
    // (before any other run: its user id is free for the next)
    let outlived = live_uids(daemon).is_some_and(|(real, saved)| real == spy_uid || saved == spy_uid);

    let mut victim_uids = Vec::new();
    for _ in 0..3 {
        let victim = system.submit("leftover.victim", json!({"api_key": VICTIM_SECRET})).await;
        let ran = system.wait_terminal(victim["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
        assert_eq!(ran["status"], "completed", "{ran}");
        victim_uids.push(ran["result"]["uid"].as_u64().unwrap() as u32);
    }
    assert!(victim_uids.contains(&spy_uid), "no victim ran as the spy's user {spy_uid}: {victim_uids:?}");
    let seen = std::fs::read_to_string(dir.join("spy")).unwrap_or_default();
    // (leave no daemon behind when the test fails)
    kill_if_still(daemon, spy_uid);
    assert!(!seen.contains(VICTIM_SECRET), "the spy read a later run's secret:\n{seen}");
    assert!(!outlived, "the spy's daemon (pid {daemon}, user {spy_uid}) outlived its run");
    system.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Kills `pid` if it still runs as `uid` (the cleanup of a failed test).
fn kill_if_still(pid: i64, uid: u32) {
    if live_uids(pid).is_some_and(|(real, _)| real == uid) {
        let _ = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
}

const FORKER: &str = "name: forker
runtime: shell
entrypoint: actions/forker.sh
max_retries: 0
";
// starts far more processes than its user may have; each one it started is counted in a file
const FORKER_SH: &str = r#"#!/bin/sh
i=0
while [ $i -lt 64 ]; do
  sleep 60 &
  i=$((i+1))
  echo $i > "${TMPDIR:-/tmp}/started"
done
echo "started all $i"
"#;
const WRITER: &str = "name: writer
runtime: shell
entrypoint: actions/writer.sh
max_retries: 0
";
// writes 3 MiB into a file
const WRITER_SH: &str = r#"#!/bin/sh
exec head -c 3145728 /dev/zero > "${TMPDIR:-/tmp}/big-$$"
"#;

/// Issue 47: an action run as a user of its own has at most `ATTUNE_ACTION_PROCESSES` processes
/// (`RLIMIT_NPROC`, counted per user, which is the run's alone) and writes no file past
/// `ATTUNE_ACTION_FILE_SIZE_MB` (`RLIMIT_FSIZE`: SIGXFSZ, a `resource_limit` failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_of_its_own_user_forks_and_writes_within_its_limits() {
    let pack = TempPack::new(
        "bounded",
        &[("forker.yaml", FORKER), ("forker.sh", FORKER_SH), ("writer.yaml", WRITER), ("writer.sh", WRITER_SH)],
    );
    let system = System::builder()
        .env("ATTUNE_WORKER_ACTION_UIDS", "70020-70029")
        .env("ATTUNE_ACTION_PROCESSES", "16")
        .env("ATTUNE_ACTION_FILE_SIZE_MB", "1")
        .pack(pack.path())
        .worker("w1", &[])
        .start()
        .await;
    let forker = system.submit("bounded.forker", json!({})).await;
    let forked = system.wait_terminal(forker["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!((forked["status"].as_str(), forked["failure_kind"].as_str()), (Some("failed"), Some("action_failed")));
    let stderr = forked["stderr"].as_str().unwrap();
    assert!(stderr.contains("Cannot fork"), "the shell says why: {forked}");
    assert!(!forked["stdout"].as_str().unwrap().contains("started all"), "{forked}");

    let writer = system.submit("bounded.writer", json!({})).await;
    let wrote = system.wait_terminal(writer["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(
        (wrote["status"].as_str(), wrote["failure_kind"].as_str()),
        (Some("failed"), Some("resource_limit")),
        "{wrote}"
    );
    let error = wrote["error"].as_str().unwrap();
    assert!(error.contains("file size") && error.contains("ATTUNE_ACTION_FILE_SIZE_MB"), "{error}");
    system.stop().await;
}

const TEMP: &str = "name: temp
runtime: shell
entrypoint: actions/temp.sh
max_retries: 0
timeout_seconds: 60
parameters:
  dir: {type: string, required: true}
  name: {type: string, required: true}
  other: {type: string, default: ''}
";
// tells where its temp directory is and what it is like, whether it can see into another run's,
// and (as `hold`) waits until told to end
const TEMP_SH: &str = r#"#!/bin/sh
echo secret > "$TMPDIR/mine"
can_list=false
[ -n "$ATTUNE_PARAM_OTHER" ] && ls "$ATTUNE_PARAM_OTHER" >/dev/null 2>&1 && can_list=true
printf '{"tmpdir": "%s", "tmp": "%s", "temp": "%s", "home": "%s", "mode": "%s", "owner": "%s", "uid": "%s", "umask": "%s", "file_mode": "%s", "can_list_other": %s}\n' \
  "$TMPDIR" "$TMP" "$TEMP" "$HOME" "$(stat -c %a "$TMPDIR")" "$(stat -c %u "$TMPDIR")" "$(id -u)" "$(umask)" \
  "$(stat -c %a "$TMPDIR/mine")" "$can_list" > "$ATTUNE_PARAM_DIR/$ATTUNE_PARAM_NAME.json"
cat "$ATTUNE_PARAM_DIR/$ATTUNE_PARAM_NAME.json"
[ "$ATTUNE_PARAM_NAME" = hold ] || exit 0
while [ ! -e "$ATTUNE_PARAM_DIR/done" ]; do sleep 0.05; done
"#;

/// Issue 47: each run of an action of its own user has a private temp directory (`TMPDIR`,
/// `TMP`, `TEMP` and `HOME`), mode 0700 and its user's, with umask 077; two runs do not share
/// one, and it is gone with everything in it once the run has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_run_has_a_private_temp_directory_gone_after_it() {
    let pack = TempPack::new("temps", &[("temp.yaml", TEMP), ("temp.sh", TEMP_SH)]);
    let system = System::builder()
        .env("ATTUNE_WORKER_ACTION_UIDS", "70030-70039")
        .pack(pack.path())
        .worker("w1", &[])
        .start()
        .await;
    let dir = shared_dir("temps");
    let held = system.submit("temps.temp", json!({"dir": dir.to_str().unwrap(), "name": "hold"})).await;
    let first: Value =
        wait_for("the first run to say where its temp directory is", Duration::from_secs(30), || async {
            serde_json::from_str(&std::fs::read_to_string(dir.join("hold.json")).ok()?).ok()
        })
        .await;
    let first_dir = first["tmpdir"].as_str().unwrap().to_string();
    let other = system
        .submit("temps.temp", json!({"dir": dir.to_str().unwrap(), "name": "look", "other": first_dir.clone()}))
        .await;
    let looked = system.wait_terminal(other["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(looked["status"], "completed", "{looked}");
    std::fs::write(dir.join("done"), "").unwrap();
    let ended = system.wait_terminal(held["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "completed", "{ended}");

    let second = &looked["result"];
    for seen in [&first, second] {
        let tmpdir = seen["tmpdir"].as_str().unwrap();
        assert!(tmpdir.starts_with('/') && tmpdir != "/tmp", "{seen}");
        for same in ["tmp", "temp", "home"] {
            assert_eq!(seen[same].as_str(), Some(tmpdir), "{same}: {seen}");
        }
        assert_eq!((seen["mode"].as_str(), seen["owner"].as_str()), (Some("700"), seen["uid"].as_str()), "{seen}");
        assert_eq!((seen["umask"].as_str(), seen["file_mode"].as_str()), (Some("0077"), Some("600")), "{seen}");
        assert!(!std::path::Path::new(tmpdir).exists(), "{tmpdir} outlived its run");
    }
    assert_ne!(first["tmpdir"], second["tmpdir"], "two runs shared a temp directory");
    assert_eq!(second["can_list_other"], false, "a run looked into another's temp directory: {second}");
    system.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}
