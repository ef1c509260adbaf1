//! Workers on hosts of their own (issue 36): each worker runs in a network namespace of this
//! machine (`attune_testkit::hosts`) and reaches PostgreSQL and RabbitMQ over its own link. A
//! stream of executions goes on while one host is cut off from the broker, from the database or
//! from both, for longer than the heartbeat limit; then the link heals. In each case every
//! execution's chain ends in success, no two attempts of one chain ran at the same time (each run
//! is marked by the action itself), and the host rejoins and is given work again. Needs root:
//! `make test-cluster` runs these, and `scripts/test.sh` in its last pass.

use std::collections::BTreeMap;
use std::time::Duration;

use attune_testkit::hosts::{Cut, TestHost};
use attune_testkit::runs::{spans, ticks_pack};
use attune_testkit::{System, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);
/// How long the cut lasts: well past the heartbeat limit the system below is given (5 s).
const CUT_FOR: Duration = Duration::from_secs(25);
/// The longest any execution may wait from its submission to the start of the run that
/// completes it: the failover, not the cut. A run cut off from the database is stopped by its
/// worker and retried once the heartbeat limit (5 s) has passed; a dispatch that does not reach a
/// worker cut off from the broker is handed back after the monitor's slack (6 s); then a second
/// or so to be scheduled and started.
const FAILOVER_WAIT: f64 = 12.0;

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// The worker each execution of `ids` ran on, by execution id.
async fn workers_of(system: &System, ids: &[i64]) -> BTreeMap<i64, Option<i64>> {
    sqlx::query_as::<_, (i64, Option<i64>)>("SELECT id, worker FROM execution WHERE id = ANY($1)")
        .bind(ids)
        .fetch_all(&system.db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Two workers, each on a host of its own; `far`'s host is cut off from `what` while executions
/// flow.
async fn cut_off(what: Cut) {
    let pack = ticks_pack("hosts", 3, 2);
    let log = std::env::temp_dir().join(format!("attune-hosts-{:016x}.log", rand::random::<u64>()));
    let (far_host, near_host) = (TestHost::create().await, TestHost::create().await);
    let (far, near) = (format!("far-{:08x}", rand::random::<u32>()), format!("near-{:08x}", rand::random::<u32>()));
    // (the near worker has room for all of it: a wait is the failover's, not a queue's)
    let (shell, roomy) = (
        [("ATTUNE_WORKER_RUNTIMES", "shell"), ("ATTUNE_WORKER_CONCURRENCY", "4")],
        [("ATTUNE_WORKER_RUNTIMES", "shell"), ("ATTUNE_WORKER_CONCURRENCY", "16")],
    );
    // (an AMQP heartbeat of 5 s: the cut outlasts it, so the broker drops the far host's
    // connection and the worker must connect again after the heal)
    let amqp = attune_testkit::amqp_url();
    let amqp = format!("{amqp}{}heartbeat=5", if amqp.contains('?') { '&' } else { '?' });
    let mut system = System::builder()
        .env("AMQP_URL", &amqp)
        .env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "5")
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "0.5")
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.1")
        .worker_on(&far_host, &far, &shell)
        .worker_on(&near_host, &near, &roomy)
        .pack(pack.path())
        .start()
        .await;
    let far_id = system.worker_id(&far).await;
    let parameters = |seconds: u64| json!({"log": log.display().to_string(), "seconds": seconds});

    // work on both hosts, some of it on the far one when the cut comes
    let mut submitted = Vec::new();
    for _ in 0..8 {
        submitted.push(id(&system.submit("hosts.run", parameters(8)).await));
    }
    wait_for("a run to be going on the far host", DEADLINE, || async {
        let on = workers_of(&system, &submitted).await;
        let spans = spans(&log);
        on.iter().any(|(id, worker)| *worker == Some(far_id) && spans.contains_key(id)).then_some(())
    })
    .await;

    far_host.cut(what);
    let healed_at = tokio::time::Instant::now() + CUT_FOR;
    // the stream goes on through the cut: one submission every 0.5 s
    while tokio::time::Instant::now() < healed_at {
        submitted.push(id(&system.submit("hosts.run", parameters(1)).await));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    far_host.heal(what);

    // nothing lost: every chain ends in success
    let mut chains = Vec::new();
    for first in &submitted {
        let chain = system.wait_chain(*first, DEADLINE).await;
        assert_eq!(chain.last().unwrap()["status"], "completed", "the chain of {first}: {chain:#?}");
        chains.push(chain);
    }
    // no two attempts of one execution ran at once: each attempt's run ended before the next
    // began (the action's own marks, not the record)
    let spans = spans(&log);
    for chain in &chains {
        let attempts: Vec<i64> = chain.iter().map(id).collect();
        for (n, first) in attempts.iter().enumerate() {
            for second in &attempts[n + 1..] {
                let (Some(a), Some(b)) = (spans.get(first), spans.get(second)) else { continue };
                assert!(
                    a.1 < b.0 || b.1 < a.0,
                    "attempts {first} and {second} ran at once for {:.2} s: {chain:#?}",
                    (a.1.min(b.1) - a.0.max(b.0)) as f64 / 1e9
                );
            }
        }
        let last = chain.last().unwrap();
        assert!(spans.contains_key(&id(last)), "the completed attempt {} never ran: {chain:#?}", id(last));
    }
    let retried = chains.iter().filter(|chain| chain.len() > 1).count();
    // the cut did what it should have: without the database the far host's run was stopped and
    // retried, its worker taken for dead; without the broker its dispatches were found lost
    let executor = system.log("executor");
    match what {
        Cut::Database | Cut::Everything => {
            let stale = chains.iter().flatten().filter(|a| a["failure_kind"] == "worker_heartbeat_stale").count();
            assert!(stale > 0 && retried > 0, "no run was failed for its worker's silence: {chains:#?}");
            assert!(executor.contains("worker heartbeat is stale: marked inactive"), "far was never taken for dead");
        }
        Cut::Broker => {
            assert_eq!(retried, 0, "a broker cut fails nothing: {chains:#?}");
            assert!(
                executor.contains("a dispatch to this worker was lost though it heartbeats"),
                "no dispatch to the cut-off host was found lost"
            );
        }
    }
    let at = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    // the longest wait from a submission to the start of the run that completed it
    let (waited, longest) = chains
        .iter()
        .map(|chain| {
            ((at(&chain.last().unwrap()["started"]) - at(&chain[0]["created"])).as_seconds_f64(), id(&chain[0]))
        })
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
    eprintln!(
        "{what:?}: {} executions, {retried} retried; the longest wait {waited:.1} s (execution {longest})",
        chains.len()
    );
    assert!(waited < FAILOVER_WAIT, "execution {longest} waited {waited:.1} s to run (cut for {CUT_FOR:?})");

    // the far host rejoins and is given work again: with the near worker stopped, it runs it all
    system.wait_consuming(&far).await;
    system.signal(&near, 15);
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(id(&system.submit("hosts.run", parameters(0)).await));
    }
    for first in &after {
        let chain = system.wait_chain(*first, DEADLINE).await;
        assert_eq!(chain.last().unwrap()["status"], "completed", "{chain:#?}");
        assert_eq!(chain.last().unwrap()["worker"], far_id, "after the heal: {chain:#?}");
    }
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (network namespaces): make test-cluster"]
async fn a_host_cut_off_from_the_broker_loses_nothing_and_rejoins() {
    cut_off(Cut::Broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (network namespaces): make test-cluster"]
async fn a_host_cut_off_from_the_database_loses_nothing_runs_nothing_twice_at_once_and_rejoins() {
    cut_off(Cut::Database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (network namespaces): make test-cluster"]
async fn a_host_cut_off_entirely_loses_nothing_runs_nothing_twice_at_once_and_rejoins() {
    cut_off(Cut::Everything).await;
}
