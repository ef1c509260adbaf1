//! A worker's write on a half-open database connection (its host cut off, a NAT that forgot the
//! connection: no reset, no data) is abandoned once it has gone unanswered past the statement
//! timeout plus a margin (`attune_common::db::answer_deadline`), and sent again on another
//! connection, where the `surely` forms read back what the lost one wrote (issue 46). Before, the
//! write waited on the silent connection (for about fifteen minutes of retransmissions on a
//! real network), and with it every claim and success of the worker, which writes them in one
//! writer.

use std::time::Duration;

use attune_testkit::pgcut::PgCut;
use attune_testkit::runs::{spans, ticks_pack};
use attune_testkit::{System, wait_for};
use serde_json::{Value, json};

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// The claim of a run goes to the server (it commits there), and its connection goes silent
/// both ways without closing. With a statement timeout of 1 s the worker gives up on that
/// connection 6 s after it sent the claim, reads back on another connection that its claim
/// landed, and runs and records the execution, once. Before, the run stayed `running` and never
/// started (the writer waited on the silent connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_connection_goes_silent_is_sent_again_and_the_run_completes() {
    let pack = ticks_pack("silent", 0, 1);
    let log = std::env::temp_dir().join(format!("attune-half-open-{:016x}.log", rand::random::<u64>()));
    let mut system = System::builder().pack(pack.path()).start().await;
    let cut = PgCut::start("127.0.0.1:5432").await;
    let name = format!("half-open-{:08x}", rand::random::<u32>());
    system.restart_with(
        &name,
        &[
            ("DATABASE_URL", &cut.url(&system.db.url)),
            ("ATTUNE_WORKER_RUNTIMES", "shell"),
            ("ATTUNE_DB_STATEMENT_TIMEOUT_SECS", "1"),
        ],
    );
    system.wait_consuming(&name).await;

    // (armed before the worker's first claim, which prepares the statement and so shows its text)
    cut.silence_on("claim_runs(");
    let started = tokio::time::Instant::now();
    let run = system.submit("silent.run", json!({"log": log.display().to_string(), "seconds": 1})).await;
    wait_for("the claim's connection to go silent", Duration::from_secs(30), || async {
        (cut.silenced() == 1).then_some(())
    })
    .await;
    // 6 s of deadline, the read-back, 1 s of run and its record: well inside 30 s
    let chain = system.wait_chain(id(&run), Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert_eq!(chain.len(), 1, "not retried: {chain:#?}");
    assert_eq!(chain[0]["status"], "completed", "{chain:#?}");
    assert!(spans(&log).contains_key(&id(&run)), "the action ran");
    assert!(took >= Duration::from_secs(6), "the claim was given up on only after its deadline: {took:?}");
    let worker = system.log(&name);
    assert!(worker.contains("the connection was abandoned"), "{worker}");
    let _ = std::fs::remove_file(&log);
    system.stop().await;
}
