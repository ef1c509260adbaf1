//! A worker's claim reads what to run from the database, and a result is recorded only with the
//! run token of the claim: each guarded write for its hit and its miss, on a fresh database.

use attune_common::db::{self, execution::NewExecution, execution::Outcome, execution::Transition};
use attune_core::ExecutionStatus::{self, *};
use attune_core::FailureKind;
use attune_testkit::TestDb;
use attune_testkit::pgcut::PgCut;
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// The core pack registered, and one `core.echo` execution of `message` in `status` on `worker`.
async fn execution_in(pool: &PgPool, status: ExecutionStatus, worker: Option<i64>, message: &str) -> i64 {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    db::pack::register(pool, &attune_common::pack::load_pack(&dir).unwrap()).await.unwrap();
    let action = db::action::get_by_ref(pool, "core.echo").await.unwrap().unwrap();
    let new = NewExecution {
        runtime: Some(action.runtime.clone()),
        parameters: json!({"message": message}),
        ..attune_testkit::echo_execution(&action)
    };
    let id = db::execution::insert(pool, &new).await.unwrap().id;
    attune_testkit::force_status(pool, id, status, worker).await;
    id
}

type Row = (ExecutionStatus, Option<i64>, Option<String>, Option<DateTime<Utc>>, DateTime<Utc>);

async fn row(pool: &PgPool, id: i64) -> Row {
    sqlx::query_as("SELECT status, worker, run_token, started, updated FROM execution WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn worker(pool: &PgPool, name: &str) -> i64 {
    db::worker::register(pool, name, &json!({"runtimes": ["shell"]})).await.unwrap()
}

#[tokio::test]
async fn a_claim_reads_the_run_from_the_database_and_stores_its_token() {
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let id = execution_in(&test.pool, Scheduled, Some(w), "from the record").await;
    let run = db::execution::worker::claim(&test.pool, w, &[(id, TOKEN)], db::execution::Patience::Once)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    assert_eq!((run.id, run.status, run.worker), (id, Running, Some(w)));
    assert_eq!(run.run_token.as_deref(), Some(TOKEN));
    let action = db::action::get_by_ref(&test.pool, "core.echo").await.unwrap().unwrap();
    assert_eq!(
        (run.runtime.as_deref(), run.entrypoint.as_deref(), run.pack_path.as_deref()),
        (Some("shell"), Some("actions/echo.sh"), action.pack_path.as_deref())
    );
    assert_eq!(
        (run.parameters, run.timeout_seconds, run.retry_count),
        (json!({"message": "from the record"}), Some(30), 0)
    );
    let limited = execution_in(&test.pool, Scheduled, Some(w), "limited").await;
    sqlx::query("UPDATE action SET limits = '{\"memory_mb\": 64}' WHERE id = $1")
        .bind(action.id)
        .execute(&test.pool)
        .await
        .unwrap();
    let run = db::execution::worker::claim(&test.pool, w, &[(limited, TOKEN)], db::execution::Patience::Once)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    assert_eq!(run.limits, Some(json!({"memory_mb": 64})), "the action's limits come with the claim");
    let stored = row(&test.pool, id).await;
    assert_eq!((stored.0, stored.2.as_deref()), (Running, Some(TOKEN)));
    assert!(stored.3.is_some(), "started is set");

    // a second claim of it (a duplicate dispatch) misses and writes nothing
    assert_eq!(
        db::execution::worker::claim(&test.pool, w, &[(id, "f".repeat(32).as_str())], db::execution::Patience::Once)
            .await
            .unwrap()
            .pop(),
        None
    );
    assert_eq!(row(&test.pool, id).await, stored);
    test.drop_database().await;
}

#[tokio::test]
async fn a_claim_of_an_execution_not_scheduled_on_the_worker_writes_nothing() {
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let other = worker(&test.pool, "other").await;
    for (status, on) in [(Requested, None), (Scheduled, Some(other)), (Running, Some(w)), (Canceled, Some(w))] {
        let id = execution_in(&test.pool, status, on, "x").await;
        let before = row(&test.pool, id).await;
        assert_eq!(
            db::execution::worker::claim(&test.pool, w, &[(id, TOKEN)], db::execution::Patience::Once)
                .await
                .unwrap()
                .pop(),
            None,
            "{status} on {on:?}"
        );
        assert_eq!(row(&test.pool, id).await, before, "{status} on {on:?}: untouched");
    }
    assert_eq!(
        db::execution::worker::claim(&test.pool, w, &[(i64::MAX, TOKEN)], db::execution::Patience::Once)
            .await
            .unwrap()
            .pop(),
        None,
        "no such execution"
    );
    test.drop_database().await;
}

#[tokio::test]
async fn a_claim_of_an_execution_whose_action_is_gone_names_no_action() {
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let id = execution_in(&test.pool, Scheduled, Some(w), "x").await;
    sqlx::query("UPDATE execution SET action = NULL WHERE id = $1").bind(id).execute(&test.pool).await.unwrap();
    let run = db::execution::worker::claim(&test.pool, w, &[(id, TOKEN)], db::execution::Patience::Once)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    assert_eq!((run.runtime, run.entrypoint, run.pack_path), (None, None, None));
    test.drop_database().await;
}

#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_read_back_by_its_token() {
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let id = execution_in(&test.pool, Scheduled, Some(w), "lost").await;
    let cut = PgCut::start("127.0.0.1:5432").await;
    let pool = db::connect(&cut.url(&test.url), 2, std::time::Duration::from_secs(10)).await.unwrap();
    cut.arm("FROM claim_runs(");
    let run =
        db::execution::worker::claim(&pool, w, &[(id, TOKEN)], db::execution::Patience::Surely).await.unwrap().pop();
    assert_eq!(cut.sprung(), 1, "the answer to the claim was lost");
    let run = run.expect("the worker knows its claim landed");
    assert_eq!(
        (run.status, run.run_token.as_deref(), run.entrypoint.as_deref()),
        (Running, Some(TOKEN), Some("actions/echo.sh"))
    );

    // without an error first, a claim that finds nothing is stale, as before (no read-back)
    let taken = execution_in(&test.pool, Scheduled, Some(w), "taken").await;
    db::execution::worker::claim(&test.pool, w, &[(taken, "a".repeat(32).as_str())], db::execution::Patience::Once)
        .await
        .unwrap()
        .pop()
        .expect("claimed by another process");
    assert_eq!(
        db::execution::worker::claim(&pool, w, &[(taken, TOKEN)], db::execution::Patience::Surely).await.unwrap().pop(),
        None
    );
    pool.close().await;
    test.drop_database().await;
}

fn failure() -> Outcome {
    Outcome { failure_kind: Some(FailureKind::TransientError), error: Some("e".into()), ..Default::default() }
}

#[tokio::test]
async fn a_result_is_recorded_only_with_the_run_token_of_its_claim() {
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let id = execution_in(&test.pool, Scheduled, Some(w), "x").await;
    db::execution::worker::claim(&test.pool, w, &[(id, TOKEN)], db::execution::Patience::Once)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    let before = row(&test.pool, id).await;
    let outcome = failure();
    let failed = |token: Option<&'static str>| {
        Transition::to(Failed).from(&[Running]).owned_by(w).outcome(&outcome).run_token(token)
    };
    let wrong = "ffffffffffffffffffffffffffffffff";
    for token in [None, Some(wrong), Some("")] {
        let missed = db::execution::transition_brief(&test.pool, id, &failed(token)).await.unwrap();
        assert_eq!(missed, None, "token {token:?}");
        assert_eq!(row(&test.pool, id).await, before, "token {token:?}: untouched");
    }
    let completion = Transition::completion(w, &outcome).run_token(None);
    assert_eq!(db::execution::transition_brief(&test.pool, id, &completion).await.unwrap(), None);
    let recorded = db::execution::transition_brief(&test.pool, id, &failed(Some(TOKEN))).await.unwrap();
    assert_eq!(recorded.map(|r| r.status), Some(Failed));
    test.drop_database().await;
}

#[tokio::test]
async fn a_run_claimed_without_a_token_takes_only_a_result_without_one() {
    // claimed by a worker of an earlier version: its result carries no token either
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let id = execution_in(&test.pool, Running, Some(w), "x").await;
    let outcome = failure();
    let failed = |token| Transition::to(Failed).from(&[Running]).owned_by(w).outcome(&outcome).run_token(token);
    assert_eq!(db::execution::transition_brief(&test.pool, id, &failed(Some(TOKEN))).await.unwrap(), None);
    let recorded = db::execution::transition_brief(&test.pool, id, &failed(None)).await.unwrap();
    assert_eq!(recorded.map(|r| r.status), Some(Failed));
    // transitions without the guard (the monitor's, the dead-letter handler's) ignore the token
    let other = execution_in(&test.pool, Scheduled, Some(w), "y").await;
    db::execution::worker::claim(&test.pool, w, &[(other, TOKEN)], db::execution::Patience::Once)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    let stale = Transition::to(Failed).from(&[Running]).outcome(&outcome);
    assert!(db::execution::transition_brief(&test.pool, other, &stale).await.unwrap().is_some());
    test.drop_database().await;
}

#[tokio::test]
async fn a_cancel_notice_is_believed_only_once_the_row_moved_on() {
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let other = worker(&test.pool, "other").await;
    let scheduled = execution_in(&test.pool, Scheduled, Some(w), "x").await;
    let running = execution_in(&test.pool, Running, Some(w), "x").await;
    let elsewhere = execution_in(&test.pool, Running, Some(other), "x").await;
    let waiting = execution_in(&test.pool, Requested, None, "x").await;
    let canceled = execution_in(&test.pool, Canceled, Some(w), "x").await;
    assert!(db::execution::worker::still_on(&test.pool, scheduled, w).await.unwrap());
    assert!(db::execution::worker::still_on(&test.pool, running, w).await.unwrap());
    assert!(!db::execution::worker::still_on(&test.pool, elsewhere, w).await.unwrap());
    assert!(!db::execution::worker::still_on(&test.pool, waiting, w).await.unwrap());
    assert!(!db::execution::worker::still_on(&test.pool, canceled, w).await.unwrap());
    assert!(!db::execution::worker::still_on(&test.pool, i64::MAX, w).await.unwrap());
    assert_eq!(db::execution::worker::runs_on(&test.pool, w).await.unwrap(), [(running, None)]);
    test.drop_database().await;
}

#[tokio::test]
async fn a_report_is_kept_only_for_its_run_and_goes_when_the_execution_leaves_running() {
    let test = TestDb::new().await;
    let w = worker(&test.pool, "w").await;
    let id = execution_in(&test.pool, Scheduled, Some(w), "reported").await;
    db::execution::worker::claim(&test.pool, w, &[(id, TOKEN)], db::execution::Patience::Once)
        .await
        .unwrap()
        .pop()
        .expect("claimed");
    let report = json!({"execution_id": id, "status": "failed"});
    // another run's token, another worker: stale
    assert!(!db::report::keep(&test.pool, id, w, Some("ffffffffffffffffffffffffffffffff"), &report).await.unwrap());
    assert!(!db::report::keep(&test.pool, id, w + 1, Some(TOKEN), &report).await.unwrap());
    assert_eq!(db::report::of(&test.pool, id).await.unwrap(), None);
    assert!(db::report::keep(&test.pool, id, w, Some(TOKEN), &report).await.unwrap());
    assert_eq!(db::report::of(&test.pool, id).await.unwrap(), Some(report.clone()));
    // waiting longer than the patience, and not before
    assert_eq!(
        db::report::waiting(&test.pool, std::time::Duration::from_secs(60), 10).await.unwrap(),
        Vec::<(i64, serde_json::Value)>::new()
    );
    sqlx::query("UPDATE execution SET reported_at = now() - interval '10 seconds' WHERE id = $1")
        .bind(id)
        .execute(&test.pool)
        .await
        .unwrap();
    assert_eq!(
        db::report::waiting(&test.pool, std::time::Duration::from_secs(5), 10).await.unwrap(),
        vec![(id, report.clone())]
    );
    // one that cannot be recorded is dropped, and kept again by the next report
    db::report::discard(&test.pool, id).await.unwrap();
    assert_eq!(db::report::of(&test.pool, id).await.unwrap(), None);
    assert!(db::report::keep(&test.pool, id, w, Some(TOKEN), &report).await.unwrap());
    // recorded: the report goes with the run
    let outcome = Outcome { failure_kind: Some(FailureKind::TransientError), ..Default::default() };
    let fail = Transition::to(Failed).from(&[Running]).owned_by(w).outcome(&outcome);
    db::execution::transition(&test.pool, id, &fail).await.unwrap().expect("failed");
    let kept: (Option<serde_json::Value>, Option<DateTime<Utc>>) =
        sqlx::query_as("SELECT report, reported_at FROM execution WHERE id = $1")
            .bind(id)
            .fetch_one(&test.pool)
            .await
            .unwrap();
    assert_eq!(kept, (None, None));
    test.drop_database().await;
}

/// Buffers of the execution table (heap) read in the open transaction so far.
async fn heap_buffers(tx: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar("SELECT pg_stat_get_xact_blocks_fetched('execution'::regclass)").fetch_one(tx).await.unwrap()
}

#[tokio::test]
async fn a_run_is_claimed_and_recorded_by_its_id_however_many_its_worker_holds() {
    // A worker holding thousands of runs, on a table with no statistics yet (as a new one, or with
    // autovacuum off): the guarded writes of one run find it by its id, and a claim counts the
    // planned worker's runs once, however long its plan. Keyed by worker alone, the in-flight
    // index had each write walk the worker's runs, a heap fetch each; and the claim counted them
    // again for every entry of its plan.
    const HELD: i64 = 5000;
    let test = TestDb::new().await;
    let w = db::worker::register(&test.pool, "w", &json!({"runtimes": ["shell"], "slots": 100_000})).await.unwrap();
    let one = execution_in(&test.pool, Scheduled, Some(w), "the one").await;
    sqlx::query(
        "INSERT INTO execution (action_ref, parameters, status, runtime, worker, started, finished) \
         SELECT 'core.echo', '{}', CASE WHEN n % 3 = 0 THEN 'scheduled' ELSE 'completed' END::execution_status, \
                'shell', $1, CASE WHEN n % 3 <> 0 THEN now() END, CASE WHEN n % 3 <> 0 THEN now() END \
         FROM generate_series(1, 3 * $2) AS n",
    )
    .bind(w)
    .bind(HELD)
    .execute(&test.pool)
    .await
    .unwrap();
    let mut tx = test.pool.begin().await.unwrap();
    let before = heap_buffers(&mut tx).await;
    let claimed: i64 = sqlx::query_scalar("SELECT count(*) FROM claim_runs(ARRAY[$1]::bigint[], ARRAY[$2], $3, false)")
        .bind(one)
        .bind(TOKEN)
        .bind(w)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let claim = heap_buffers(&mut tx).await - before;
    let recorded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM complete_runs(ARRAY[$1]::bigint[], ARRAY[$2], ARRAY[NULL]::jsonb[], ARRAY[NULL], \
         ARRAY[0], ARRAY[NULL], ARRAY[NULL], ARRAY[NULL]::int[], $3, false)",
    )
    .bind(one)
    .bind(TOKEN)
    .bind(w)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let record = heap_buffers(&mut tx).await - before - claim;
    assert_eq!((claimed, recorded), (1, 1));
    assert!(claim < 50 && record < 50, "heap buffers: {claim} for the claim, {record} for the success");
    // the executors' claim counts what the worker holds once, however long its plan: a plan of
    // 16 reads about what a plan of one does
    sqlx::query(
        "INSERT INTO execution (action_ref, parameters, status, runtime) \
         SELECT 'core.echo', '{}', 'requested', 'shell' FROM generate_series(1, 17)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let mut read = Vec::new();
    for plan in [vec![w], vec![w; 16]] {
        let before = heap_buffers(&mut tx).await;
        let placed: i64 = sqlx::query_scalar("SELECT count(*) FROM execution_claim('shell', $1)")
            .bind(&plan)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(placed, plan.len() as i64);
        read.push(heap_buffers(&mut tx).await - before);
    }
    eprintln!("claims of one and of 16 read {read:?} heap buffers");
    assert!(read[1] < 3 * read[0], "heap buffers for a claim of one and of 16, beside {HELD} held: {read:?}");
    tx.rollback().await.unwrap();
    test.drop_database().await;
}

#[tokio::test]
async fn claims_and_successes_written_together_each_keep_their_guard_and_fence() {
    let test = TestDb::new().await;
    let (w, other) = (worker(&test.pool, "w").await, worker(&test.pool, "other").await);
    const OTHER_TOKEN: &str = "fedcba9876543210fedcba9876543210";
    let to_claim = execution_in(&test.pool, Scheduled, Some(w), "to claim").await;
    let elsewhere = execution_in(&test.pool, Scheduled, Some(other), "elsewhere").await;
    let (to_record, taken_over) = (
        execution_in(&test.pool, Scheduled, Some(w), "to record").await,
        execution_in(&test.pool, Scheduled, Some(w), "taken over").await,
    );
    // running here: one with this run's token, one since claimed again under another
    for (id, token) in [(to_record, TOKEN), (taken_over, OTHER_TOKEN)] {
        db::execution::worker::claim(&test.pool, w, &[(id, token)], db::execution::Patience::Once)
            .await
            .unwrap()
            .pop()
            .expect("claimed");
    }
    let outcome = Outcome { exit_code: Some(0), stdout: Some("done\n".into()), ..Default::default() };
    let (claimed, completed) = db::execution::worker::claim_and_complete(
        &test.pool,
        w,
        &[(to_claim, TOKEN), (elsewhere, TOKEN)],
        &[(to_record, &outcome, Some(TOKEN)), (taken_over, &outcome, Some(TOKEN))],
        db::execution::Patience::Surely,
    )
    .await
    .unwrap();
    assert_eq!(claimed.iter().map(|run| (run.id, run.status)).collect::<Vec<_>>(), [(to_claim, Running)]);
    assert_eq!(claimed[0].run_token.as_deref(), Some(TOKEN));
    assert_eq!(
        (claimed[0].runtime.as_deref(), claimed[0].parameters.clone()),
        (Some("shell"), json!({"message": "to claim"}))
    );
    assert_eq!(completed.iter().map(|row| (row.id, row.status)).collect::<Vec<_>>(), [(to_record, Completed)]);
    // and the rows say the same: the misses are untouched
    assert_eq!(row(&test.pool, to_claim).await.0, Running);
    assert_eq!((row(&test.pool, elsewhere).await.0, row(&test.pool, elsewhere).await.1), (Scheduled, Some(other)));
    let stdout: Option<String> = sqlx::query_scalar("SELECT stdout FROM execution WHERE id = $1")
        .bind(to_record)
        .fetch_one(&test.pool)
        .await
        .unwrap();
    assert_eq!((row(&test.pool, to_record).await.0, stdout.as_deref()), (Completed, Some("done\n")));
    let (status, _, token, _, _) = row(&test.pool, taken_over).await;
    assert_eq!((status, token.as_deref()), (Running, Some(OTHER_TOKEN)));
    test.drop_database().await;
}
