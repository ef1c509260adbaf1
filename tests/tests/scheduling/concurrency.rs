//! Concurrency policies against the real binaries, two executors claiming: `limit: 1, key: host`
//! never runs two executions for one host at once, and a host's queue never waits behind another
//! host's; a policy an operator sets through the API holds the same way and ends when cleared.

use std::collections::BTreeMap;
use std::time::Duration;

use attune_testkit::{System, TempPack, wait_for};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

fn pack() -> TempPack {
    TempPack::new(
        "lim",
        &[
            (
                "per_host.yaml",
                "name: per_host\nruntime: shell\nentrypoint: actions/hold.sh\nparameters:\n  host: {type: string, required: true}\n  hold: {type: string, default: '0.2'}\nconcurrency: {limit: 1, key: host}\n",
            ),
            (
                "any.yaml",
                "name: any\nruntime: shell\nentrypoint: actions/hold.sh\nparameters:\n  host: {type: string, default: x}\n  hold: {type: string, default: '0.3'}\n",
            ),
            ("hold.sh", "#!/bin/sh\nsleep \"$ATTUNE_PARAM_HOLD\"\necho \"$ATTUNE_PARAM_HOST\"\n"),
        ],
    )
}

/// A row as read: id, key, status, retry count, started, finished.
type Row = (i64, String, String, i32, Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// Each execution's run as the database recorded it: (id, key, started, finished), every one
/// completed at its first attempt.
async fn runs(system: &System, ids: &[i64]) -> Vec<(i64, String, DateTime<Utc>, DateTime<Utc>)> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, parameters->>'host', status::text, retry_count, started, finished FROM execution \
         WHERE id = ANY($1) ORDER BY id",
    )
    .bind(ids)
    .fetch_all(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), ids.len());
    rows.into_iter()
        .map(|(id, host, status, retries, started, finished)| {
            assert_eq!((status.as_str(), retries), ("completed", 0), "execution {id} ({host})");
            (id, host, started.unwrap(), finished.unwrap())
        })
        .collect()
}

/// The largest number of these runs under one key that were in flight at one moment.
fn most_at_once(runs: &[(i64, String, DateTime<Utc>, DateTime<Utc>)]) -> BTreeMap<String, usize> {
    let mut most = BTreeMap::new();
    for (_, key, started, _) in runs {
        let at_once = runs.iter().filter(|(_, k, s, f)| k == key && s <= started && started < f).count();
        let entry = most.entry(key.clone()).or_insert(0);
        *entry = (*entry).max(at_once);
    }
    most
}

async fn all_terminal(system: &System, ids: &[i64]) {
    let pool = system.db.pool.clone();
    let ids = ids.to_vec();
    wait_for("every execution to finish", Duration::from_secs(120), || {
        let (pool, ids) = (pool.clone(), ids.clone());
        async move {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM execution WHERE id = ANY($1) \
                 AND status IN ('requested', 'scheduled', 'running', 'delayed')",
            )
            .bind(&ids)
            .fetch_one(&pool)
            .await
            .unwrap();
            (open == 0).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_at_a_time_per_host_and_no_host_waits_behind_another() {
    let pack = pack();
    let mut system = System::builder()
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin"), ("ATTUNE_WORKER_CONCURRENCY", "4")])
        .worker("w2", &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin"), ("ATTUNE_WORKER_CONCURRENCY", "4")])
        .start()
        .await;
    system.spawn_executor("executor-2");
    let (_, action) = system.get("/api/v1/actions/lim.per_host").await;
    assert_eq!(action["concurrency"], json!({"limit": 1, "key": "host"}), "{action}");
    assert_eq!(action["concurrency_declared"], action["concurrency"], "{action}");

    // host a's long runs first, in the queue ahead of b's and c's: 20 over 3 hosts
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(id(&system.submit("lim.per_host", json!({"host": "a", "hold": "2"})).await));
    }
    for n in 0..15 {
        let host = if n % 2 == 0 { "b" } else { "c" };
        ids.push(id(&system.submit("lim.per_host", json!({"host": host})).await));
    }
    // what waits beyond the limit waits as requested (nothing fails meanwhile)
    let pool = system.db.pool.clone();
    wait_for("requests held back by the policy", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let (running, waiting): (i64, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE status IN ('scheduled', 'running') AND parameters->>'host' = 'a'), \
                        count(*) FILTER (WHERE status = 'requested' AND parameters->>'host' = 'a') \
                 FROM execution WHERE action_ref = 'lim.per_host'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (running == 1 && waiting >= 3).then_some(())
        }
    })
    .await;
    all_terminal(&system, &ids).await;
    let runs = runs(&system, &ids).await;
    let most = most_at_once(&runs);
    assert_eq!(most, BTreeMap::from([("a".into(), 1), ("b".into(), 1), ("c".into(), 1)]), "{runs:?}");
    // b's and c's queues ran beside a's, not behind it: each began before a's first run ended,
    // and ended before a's last began
    let a_runs: Vec<_> = runs.iter().filter(|r| r.1 == "a").collect();
    for host in ["b", "c"] {
        let first_started = runs.iter().filter(|r| r.1 == host).map(|r| r.2).min().unwrap();
        let last_finished = runs.iter().filter(|r| r.1 == host).map(|r| r.3).max().unwrap();
        assert!(first_started < a_runs[0].3, "host {host} waited behind host a: {runs:?}");
        assert!(last_finished < a_runs[4].2, "host {host} waited behind host a: {runs:?}");
    }
    // and a's ran in the order submitted
    let a_order: Vec<i64> = {
        let mut a = a_runs.clone();
        a.sort_by_key(|r| r.2);
        a.iter().map(|r| r.0).collect()
    };
    assert!(a_order.is_sorted(), "host a's runs out of order: {a_order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_s_policy_holds_until_cleared() {
    let pack = pack();
    let mut system = System::builder()
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin"), ("ATTUNE_WORKER_CONCURRENCY", "8")])
        .start()
        .await;
    system.spawn_executor("executor-2");
    let put = |body: Value| {
        let system = &system;
        async move {
            system
                .request(reqwest::Method::PUT, "/api/v1/actions/lim.any/concurrency", Some(&body), Some(&system.token))
                .await
        }
    };
    for (body, code, parameter) in [
        (json!({"limit": 0, "reason": "x"}), 422, Some("limit")),
        (json!({"limit": 1, "key": "nope", "reason": "x"}), 422, Some("key")),
        (json!({"limit": null, "key": "host", "reason": "x"}), 422, Some("key")),
        (json!({"limit": 1, "reason": " "}), 422, Some("reason")),
    ] {
        let (status, answer) = put(body.clone()).await;
        assert_eq!((status, answer["error"]["parameter"].as_str()), (code, parameter), "{body}: {answer}");
    }
    let (status, answer) = system
        .request(
            reqwest::Method::PUT,
            "/api/v1/actions/lim.nope/concurrency",
            Some(&json!({"limit": 1, "reason": "x"})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 404, "{answer}");

    let (status, action) = put(json!({"limit": 2, "reason": "the backend takes two"})).await;
    assert_eq!(status, 200, "{action}");
    assert_eq!(action["concurrency"], json!({"limit": 2, "key": null}), "{action}");
    assert_eq!(action["concurrency_declared"], Value::Null, "{action}");
    assert_eq!(action["concurrency_set"]["reason"], "the backend takes two", "{action}");
    let ids: Vec<i64> = {
        let mut ids = Vec::new();
        for n in 0..8 {
            ids.push(id(&system.submit("lim.any", json!({"host": format!("h{n}")})).await));
        }
        ids
    };
    all_terminal(&system, &ids).await;
    let held = runs(&system, &ids).await;
    let as_one: Vec<_> = held.iter().map(|(id, _, s, f)| (*id, String::new(), *s, *f)).collect();
    assert_eq!(most_at_once(&as_one)[""], 2, "{held:?}");

    // an operator's "no limit" stands in for a pack's policy; clearing it brings the pack's back
    let (status, action) = system
        .request(
            reqwest::Method::PUT,
            "/api/v1/actions/lim.per_host/concurrency",
            Some(&json!({"limit": null, "reason": "drain the backlog"})),
            Some(&system.token),
        )
        .await;
    assert_eq!((status, &action["concurrency"]), (200, &Value::Null), "{action}");
    let ids: Vec<i64> = {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(id(&system.submit("lim.per_host", json!({"host": "a", "hold": "1"})).await));
        }
        ids
    };
    all_terminal(&system, &ids).await;
    assert!(most_at_once(&runs(&system, &ids).await)["a"] > 1, "the operator's 'no limit' was not in force");
    let (status, action) = system
        .request(reqwest::Method::DELETE, "/api/v1/actions/lim.per_host/concurrency", None, Some(&system.token))
        .await;
    assert_eq!((status, &action["concurrency"]), (200, &json!({"limit": 1, "key": "host"})), "{action}");
    let (status, _) = system
        .request(reqwest::Method::DELETE, "/api/v1/actions/lim.per_host/concurrency", None, Some(&system.token))
        .await;
    assert_eq!(status, 404);
    // both changes are in the audit trail, with the reason
    let audited: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT method, reason FROM audit_event WHERE route = '/api/v1/actions/{action_ref}/concurrency' \
         AND status = 200 AND target = 'action:lim.per_host' ORDER BY id",
    )
    .fetch_all(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(audited, vec![("PUT".into(), Some("drain the backlog".into())), ("DELETE".into(), None)]);

    // the CLI
    let attune = |args: &[&str]| {
        let out = system.attune(args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, shown, _) = attune(&["concurrency", "lim.per_host"]);
    assert!(ok && shown.contains("at most 1 at once per value of 'host', its pack's"), "{shown}");
    let (ok, _, error) = attune(&["concurrency", "lim.per_host", "--limit", "3"]);
    assert!(!ok && error.contains("--reason"), "{error}");
    let (ok, shown, _) = attune(&["concurrency", "lim.per_host", "--limit", "3", "--key", "host", "--reason", "more"]);
    assert!(ok && shown.contains("at most 3 at once per value of 'host', an operator's"), "{shown}");
    let (ok, shown, _) = attune(&["concurrency", "lim.per_host", "--clear"]);
    assert!(ok && shown.contains("its pack's"), "{shown}");
    system.stop().await;
}

/// Issue 46 (review R3): a run canceled while it runs keeps its key's slot until its processes
/// are gone. The action traps SIGTERM and goes on 1.5 s (inside the worker's 2 s grace before
/// SIGKILL); the next run of its key, waiting, starts only after the first's last mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_run_keeps_its_slot_until_its_processes_are_gone() {
    let dir = std::env::temp_dir().join(format!("attune-linger-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = "#!/bin/sh\n\
        mark() { date +%s%N >> \"$ATTUNE_PARAM_DIR/$ATTUNE_EXECUTION_ID\"; }\n\
        trap 'for i in 1 2 3 4 5 6; do mark; sleep 0.25; done; exit 143' TERM\n\
        mark\n\
        while true; do mark; sleep 0.1; done\n";
    let pack = TempPack::new(
        "linger",
        &[
            (
                "hold.yaml",
                "name: hold\nruntime: shell\nentrypoint: actions/hold.sh\nparameters:\n  host: {type: string, required: true}\n  dir: {type: string, required: true}\nconcurrency: {limit: 1, key: host}\n",
            ),
            ("hold.sh", script),
        ],
    );
    let system = System::builder()
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell"), ("ATTUNE_WORKER_CONCURRENCY", "4")])
        .start()
        .await;
    let params = json!({"host": "db1", "dir": dir.to_str().unwrap()});
    let first = system.submit("linger.hold", params.clone()).await;
    wait_for("the first run to mark", Duration::from_secs(30), || async {
        dir.join(id(&first).to_string()).exists().then_some(())
    })
    .await;
    let second = system.submit("linger.hold", params).await;
    let canceled_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let (status, _) = system.post(&format!("/api/v1/executions/{}/cancel", id(&first)), &json!({})).await;
    assert_eq!(status, 200);
    let second_marks = dir.join(id(&second).to_string());
    wait_for("the second run to start", Duration::from_secs(30), || async { second_marks.exists().then_some(()) })
        .await;
    let read = |path: std::path::PathBuf| -> Vec<u128> {
        std::fs::read_to_string(path).unwrap().lines().filter_map(|l| l.trim().parse().ok()).collect()
    };
    // the canceled run's marks are all in once its file stops growing (its trap marks every 0.25 s)
    let first_marks = dir.join(id(&first).to_string());
    let first_last = wait_for("the canceled run to end", Duration::from_secs(10), || async {
        let before = read(first_marks.clone()).len();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let after = read(first_marks.clone());
        (after.len() == before).then(|| *after.iter().max().unwrap())
    })
    .await;
    let second_first = *read(second_marks).iter().min().unwrap();
    eprintln!(
        "after the cancel: the canceled run's last mark {:.2} s, the next run's first {:.2} s",
        (first_last - canceled_at) as f64 / 1e9,
        (second_first - canceled_at) as f64 / 1e9
    );
    assert!(
        first_last < second_first,
        "the next run of the key started {:.2} s before the canceled one's processes were gone",
        (first_last - second_first) as f64 / 1e9
    );
    let (status, _) = system.post(&format!("/api/v1/executions/{}/cancel", id(&second)), &json!({})).await;
    assert_eq!(status, 200);
    let _ = std::fs::remove_dir_all(&dir);
    system.stop().await;
}
