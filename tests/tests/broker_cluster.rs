//! attune on a RabbitMQ cluster of three nodes (`scripts/test-cluster.sh`, run by `make
//! test-cluster`; it needs root and Debian's rabbitmq-server): every service is given the three
//! nodes in `AMQP_URL`, and a stream of executions goes on while one node's broker stops, then
//! while the node that leads the worker's queue stops. Every execution completes, each action ran
//! once per attempt the record shows, and nothing waits much longer than the failover.

use std::process::Command;
use std::time::{Duration, Instant};

use attune_testkit::system::repo_root;
use attune_testkit::{System, wait_for};
use serde_json::json;

const EXECUTIONS: usize = 150;

fn cluster(args: &[&str]) -> String {
    let out = Command::new(repo_root().join("scripts/test-cluster.sh")).args(args).output().unwrap();
    assert!(out.status.success(), "test-cluster.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The node (`a`, `b` or `c`) that leads the first quorum queue whose name starts with `prefix`.
fn leader_of(prefix: &str) -> char {
    let out = Command::new("/usr/lib/rabbitmq/bin/rabbitmqctl")
        .env("HOME", "/var/lib/rabbitmq")
        .args(["-q", "-n", "attune-a@localhost", "list_queues", "name", "leader", "--no-table-headers"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    let line = listed
        .lines()
        .find(|l| l.split_whitespace().next().is_some_and(|name| name.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no queue {prefix}*: {listed}"));
    let leader = line.split_whitespace().nth(1).unwrap();
    leader.trim_start_matches("attune-").chars().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and the three-node cluster of scripts/test-cluster.sh: make test-cluster"]
async fn executions_complete_once_while_cluster_nodes_stop() {
    cluster(&["start"]);
    let urls = cluster(&["urls"]);
    let marks = std::env::temp_dir().join(format!("attune-cluster-marks-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&marks).unwrap();
    let pack = attune_testkit::runs::marking_pack("cl", &marks);
    let system = System::builder()
        .env("AMQP_URL", &urls)
        .pack(pack.path())
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin")])
        .start()
        .await;

    let mut ids = Vec::new();
    let started = Instant::now();
    for n in 0..EXECUTIONS {
        if n == EXECUTIONS / 3 {
            cluster(&["stop-node", "b"]);
        }
        if n == 2 * EXECUTIONS / 3 {
            cluster(&["start-node", "b"]);
            let leader = leader_of(&format!("{}.worker.", system.namespace.name));
            cluster(&["stop-node", &leader.to_string()]);
        }
        ids.push(system.submit("cl.mark", json!({"n": n})).await["id"].as_i64().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pool = system.db.pool.clone();
    wait_for("every chain to complete", Duration::from_secs(120), || {
        let pool = pool.clone();
        async move {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM execution WHERE status IN ('requested', 'scheduled', 'running', 'delayed')",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (open == 0).then_some(())
        }
    })
    .await;
    let took = started.elapsed();
    // each submission's chain ended completed; the action ran once per attempt the record has
    for (n, id) in ids.iter().enumerate() {
        let chain: Vec<(i64, String)> = sqlx::query_as(
            "SELECT id, status::text FROM execution WHERE id = $1 OR original_execution IN \
             (WITH RECURSIVE c(id) AS (SELECT $1 UNION SELECT e.id FROM execution e JOIN c ON e.original_execution = c.id) SELECT id FROM c) ORDER BY id",
        )
        .bind(id)
        .fetch_all(&system.db.pool)
        .await
        .unwrap();
        assert_eq!(chain.last().map(|c| c.1.as_str()), Some("completed"), "submission {n}: {chain:?}");
        let ran = std::fs::read_to_string(marks.join(n.to_string())).unwrap_or_default();
        let runs: Vec<i64> = ran.lines().map(|l| l.parse().unwrap()).collect();
        let attempts: Vec<i64> = chain.iter().map(|c| c.0).collect();
        assert!(runs.iter().all(|r| attempts.contains(r)), "submission {n} ran outside its chain: {runs:?} {chain:?}");
        let mut once = runs.clone();
        once.sort_unstable();
        once.dedup();
        assert_eq!(once.len(), runs.len(), "submission {n}: an attempt ran twice: {runs:?}");
    }
    assert!(took < Duration::from_secs(90), "the stream took {took:?}");
    // the nodes did go away under the services, which moved to the others
    let lost: usize = ["api", "executor", "w1"]
        .iter()
        .map(|name| {
            system.log(name).matches("lost its broker connection").count()
                + system.log(name).matches("publish failed, reconnecting").count()
        })
        .sum();
    assert!(lost > 0, "no service lost a broker connection: the nodes were not stopped under them");
    cluster(&["start-node", "a"]);
    cluster(&["start-node", "b"]);
    cluster(&["start-node", "c"]);
    system.stop().await;
    let _ = std::fs::remove_dir_all(&marks);
}
