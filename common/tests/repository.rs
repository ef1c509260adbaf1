//! Repository tests on the real PostgreSQL, a fresh database per test.

use attune_common::db::{
    self, execution::NewExecution, execution::Outcome, execution::Patience, execution::Transition,
};
use attune_common::pack::load_pack;
use attune_core::ExecutionStatus::{self, *};
use attune_testkit::TestDb;
use serde_json::json;
use sqlx::PgPool;

async fn core_pack(pool: &PgPool) -> db::action::Action {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    db::pack::register(pool, &load_pack(&dir).unwrap()).await.unwrap();
    db::action::get_by_ref(pool, "core.echo").await.unwrap().unwrap()
}

fn new_execution(action: &db::action::Action) -> NewExecution {
    attune_testkit::echo_execution(action)
}

use attune_testkit::force_status;

#[tokio::test]
async fn every_edge_hits_from_its_source_and_misses_from_any_other_state() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let worker = db::worker::register(pool, "w", &json!({"runtimes": ["shell"]})).await.unwrap();
    let outcome = Outcome {
        failure_kind: Some(attune_core::FailureKind::ActionFailed),
        exit_code: Some(1),
        ..Default::default()
    };
    for to in ExecutionStatus::ALL {
        for from in ExecutionStatus::ALL {
            let execution = db::execution::insert(pool, &new_execution(&action)).await.unwrap();
            force_status(pool, execution.id, from, Some(worker)).await;
            let transition = Transition::to(to).outcome(&outcome);
            let applied = db::execution::transition(pool, execution.id, &transition).await.unwrap();
            let edge = ExecutionStatus::can_transition(from, to);
            assert_eq!(applied.is_some(), edge, "{from} -> {to}");
            let stored = db::execution::get(pool, execution.id).await.unwrap().unwrap();
            if edge {
                let applied = applied.unwrap();
                assert_eq!(applied.status, to);
                assert_eq!(stored, applied);
                assert_eq!(stored.finished.is_some(), to.is_terminal(), "{from} -> {to}");
                if to.is_terminal() {
                    assert_eq!(stored.failure_kind, Some(attune_core::FailureKind::ActionFailed));
                }
            } else {
                assert_eq!(stored.status, from, "a stale transition changes nothing");
            }
        }
    }
    test.drop_database().await;
}

#[tokio::test]
async fn worker_owned_transitions_are_fenced_by_the_worker() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let mine = db::worker::register(pool, "mine", &json!({})).await.unwrap();
    let other = db::worker::register(pool, "other", &json!({})).await.unwrap();
    let execution = db::execution::insert(pool, &new_execution(&action)).await.unwrap();

    let claim = Transition::to(Scheduling).from(&[Requested, Scheduling]);
    assert!(db::execution::transition(pool, execution.id, &claim).await.unwrap().is_some());
    let assign = Transition::to(Scheduled).from(&[Scheduling]).assign_worker(mine);
    assert_eq!(db::execution::transition(pool, execution.id, &assign).await.unwrap().unwrap().worker, Some(mine));
    assert!(
        db::execution::transition(pool, execution.id, &assign).await.unwrap().is_none(),
        "a duplicate assignment misses"
    );

    let run_as = |worker| Transition::to(Running).from(&[Scheduled]).owned_by(worker);
    assert!(
        db::execution::transition(pool, execution.id, &run_as(other)).await.unwrap().is_none(),
        "another worker cannot claim it"
    );
    let running = db::execution::transition(pool, execution.id, &run_as(mine)).await.unwrap().unwrap();
    assert!(running.started.is_some());

    let done = Outcome { exit_code: Some(0), stdout: Some("hi\n".into()), ..Default::default() };
    let complete_as = |worker| Transition::to(Completed).from(&[Running]).owned_by(worker);
    assert!(db::execution::transition(pool, execution.id, &complete_as(other).outcome(&done)).await.unwrap().is_none());
    let completed =
        db::execution::transition(pool, execution.id, &complete_as(mine).outcome(&done)).await.unwrap().unwrap();
    assert_eq!(
        (completed.status, completed.exit_code, completed.stdout.as_deref()),
        (Completed, Some(0), Some("hi\n"))
    );
    assert!(
        db::execution::transition(pool, execution.id, &complete_as(mine).outcome(&done)).await.unwrap().is_none(),
        "a redelivered result misses"
    );
    test.drop_database().await;
}

#[tokio::test]
async fn the_schema_enforces_finished_and_one_retry_per_execution() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let first = db::execution::insert(pool, &new_execution(&action)).await.unwrap();
    let bad = sqlx::query("UPDATE execution SET status = 'completed' WHERE id = $1").bind(first.id).execute(pool).await;
    assert!(bad.unwrap_err().to_string().contains("execution_finished_iff_terminal"));

    let retry =
        NewExecution { original_execution: Some(first.id), retry_count: 1, status: Delayed, ..new_execution(&action) };
    db::execution::insert(pool, &retry).await.unwrap();
    let duplicate = db::execution::insert(pool, &retry).await.unwrap_err();
    assert!(duplicate.to_string().contains("execution_one_retry_per_parent"), "{duplicate}");
    test.drop_database().await;
}

#[tokio::test]
async fn queue_depth_counts_dispatched_unfinished_work_in_rust_and_sql() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let capabilities = json!({"runtimes": ["shell"], "health": {"consecutive_failures": 0}});
    let worker = db::worker::register(pool, "w", &capabilities).await.unwrap();
    let (inactive, _) = db::worker::candidates(pool).await.unwrap();
    assert!(inactive.is_empty(), "a registered worker gets no work before its first heartbeat");
    db::worker::heartbeat(pool, worker, &capabilities).await.unwrap();
    for status in [Scheduled, Running, Running, Completed, Requested] {
        let execution = db::execution::insert(pool, &new_execution(&action)).await.unwrap();
        force_status(pool, execution.id, status, Some(worker)).await;
    }
    let sql_depth: i32 =
        sqlx::query_scalar("SELECT get_worker_queue_depth($1)").bind(worker).fetch_one(pool).await.unwrap();
    let (candidates, _) = db::worker::candidates(pool).await.unwrap();
    assert_eq!(sql_depth, 3);
    assert_eq!(candidates[0].signals.queue_depth, 3);
    assert_eq!(candidates[0].runtimes, vec!["shell".to_string()]);
    let view: Vec<(String, String, i32)> =
        sqlx::query_as("SELECT name, health, queue_depth FROM healthy_workers").fetch_all(pool).await.unwrap();
    assert_eq!(view, vec![("w".to_string(), "healthy".to_string(), 3)]);
    test.drop_database().await;
}

#[tokio::test]
async fn tokens_verify_by_hash_and_revocation_takes_effect() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let token = db::token::create(pool, "ci").await.unwrap();
    let id = db::token::verify(pool, &token).await.unwrap().expect("fresh token verifies");
    assert!(db::token::verify(pool, "attune_guess").await.unwrap().is_none());
    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT token_hash FROM api_token WHERE id = $1").bind(id).fetch_one(pool).await.unwrap();
    assert_ne!(stored, token.as_bytes(), "the token itself is never stored");
    sqlx::query("UPDATE api_token SET revoked = now() WHERE id = $1").bind(id).execute(pool).await.unwrap();
    assert!(db::token::verify(pool, &token).await.unwrap().is_none());
    test.drop_database().await;
}

#[tokio::test]
async fn registering_a_pack_again_updates_it_and_drops_removed_actions() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let dir = std::env::temp_dir().join(format!("attune-repo-pack-{}", rand_suffix()));
    std::fs::create_dir_all(dir.join("actions")).unwrap();
    std::fs::write(dir.join("pack.yaml"), "ref: p\nversion: 1.0.0\n").unwrap();
    std::fs::write(dir.join("actions/a.sh"), "true\n").unwrap();
    std::fs::write(
        dir.join("actions/a.yaml"),
        "name: a\nruntime: shell\nentrypoint: actions/a.sh\nmax_retries: 3\ntimeout_seconds: 120\n",
    )
    .unwrap();
    std::fs::write(dir.join("actions/b.yaml"), "name: b\nruntime: shell\nentrypoint: actions/a.sh\n").unwrap();
    let first = db::pack::register(pool, &load_pack(&dir).unwrap()).await.unwrap();
    assert_eq!(first.action_count, 2);
    let policy: (Option<i32>, Option<i32>) =
        sqlx::query_as("SELECT timeout_seconds, max_retries FROM action WHERE ref = 'p.a'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(policy, (Some(120), Some(3)));
    std::fs::remove_file(dir.join("actions/b.yaml")).unwrap();
    std::fs::write(dir.join("pack.yaml"), "ref: p\nversion: 1.1.0\n").unwrap();
    let second = db::pack::register(pool, &load_pack(&dir).unwrap()).await.unwrap();
    assert_eq!((second.id, second.version.as_str(), second.action_count), (first.id, "1.1.0", 1));
    std::fs::remove_dir_all(&dir).unwrap();
    test.drop_database().await;
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

#[tokio::test]
async fn nul_characters_in_output_are_stored_replaced_not_refused() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let execution = db::execution::insert(pool, &new_execution(&action)).await.unwrap();
    force_status(pool, execution.id, Running, None).await;
    let outcome = Outcome { stdout: Some("a\0b".into()), result: Some(json!({"k\0": ["x\0"]})), ..Default::default() };
    let done = db::execution::transition(pool, execution.id, &Transition::to(Completed).outcome(&outcome))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.stdout.as_deref(), Some("a\u{FFFD}b"));
    assert_eq!(done.result, Some(json!({"k\u{FFFD}": ["x\u{FFFD}"]})));
    test.drop_database().await;
}

#[tokio::test]
async fn config_records_the_retry_fields_in_force() {
    let test = TestDb::new().await;
    let action = core_pack(&test.pool).await;
    // a first attempt: its budget and count, and none of a retry's fields whatever the client wrote
    let first = NewExecution {
        max_retries: 3,
        config: json!({"team": "ops", "max_retries": 99, "retry_reason": "manual_retry", "original_execution": 1}),
        ..new_execution(&action)
    };
    let first = db::execution::insert(&test.pool, &first).await.unwrap();
    assert_eq!(first.config, json!({"team": "ops", "max_retries": 3, "retry_count": 0}));
    // its retry: Example 4's fields, as they are
    let retry = NewExecution::retry_of(&first, Delayed, attune_core::FailureKind::TransientError, None, None);
    let retry = db::execution::insert(&test.pool, &retry).await.unwrap();
    assert_eq!(
        retry.config,
        json!({"team": "ops", "max_retries": 3, "retry_count": 1, "retry_of": first.id,
               "original_execution": first.id, "retry_reason": "transient_error"})
    );
    // the seed's query reads it
    let config: serde_json::Value = sqlx::query_scalar("SELECT config FROM execution WHERE id = $1")
        .bind(first.id)
        .fetch_one(&test.pool)
        .await
        .unwrap();
    assert_eq!(config["max_retries"], 3);
    test.drop_database().await;
}

#[tokio::test]
async fn a_batch_of_submissions_is_one_insert_in_order_with_each_token() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let token = db::token::create_with(pool, "submitter", db::token::Role::Operator, None).await.unwrap().0.id;
    let news: Vec<NewExecution> = (0..5)
        .map(|n| {
            let mut new = new_execution(&action);
            new.parameters = json!({"message": format!("m{n}")});
            new
        })
        .collect();
    let by = db::execution::Submitter::token(token);
    let batch: Vec<(&NewExecution, &db::execution::Submitter)> = news.iter().map(|new| (new, &by)).collect();
    let rows = db::execution::api::insert_many_submitted(pool, &batch, Patience::Once).await.unwrap();
    let messages: Vec<&str> = rows.iter().map(|row| row.parameters["message"].as_str().unwrap()).collect();
    assert_eq!(messages, ["m0", "m1", "m2", "m3", "m4"], "rows come back in the order given");
    assert!(rows.windows(2).all(|pair| pair[0].id < pair[1].id), "ids in submission order");
    for row in &rows {
        assert_eq!((row.status, row.submitted_by, row.runtime.as_deref()), (Requested, Some(token), Some("shell")));
        assert_eq!(row.config["max_retries"], json!(row.max_retries), "config records the budget");
        assert!(!row.idempotency_key.is_empty(), "each chain draws its own key");
    }
    let transactions: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM execution").fetch_one(pool).await.unwrap();
    assert_eq!(transactions, 1, "one statement, one commit");
    test.drop_database().await;
}

#[tokio::test]
async fn batched_claims_and_successes_keep_each_rows_guard_fence_and_token() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let mine = db::worker::register(pool, "mine", &json!({})).await.unwrap();
    let other = db::worker::register(pool, "other", &json!({})).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(db::execution::insert(pool, &new_execution(&action)).await.unwrap().id);
    }
    // ids[0], ids[1]: dispatched here; ids[2]: dispatched to another worker; ids[3]: canceled
    force_status(pool, ids[0], Scheduled, Some(mine)).await;
    force_status(pool, ids[1], Scheduled, Some(mine)).await;
    force_status(pool, ids[2], Scheduled, Some(other)).await;
    force_status(pool, ids[3], Canceled, Some(mine)).await;
    let claims: Vec<(i64, &str)> = vec![(ids[0], "t0"), (ids[1], "t1"), (ids[2], "t2"), (ids[3], "t3")];
    let mut runs = db::execution::worker::claim(pool, mine, &claims, Patience::Surely).await.unwrap();
    runs.sort_by_key(|run| run.id);
    let claimed: Vec<(i64, Option<&str>, Option<&str>)> =
        runs.iter().map(|run| (run.id, run.run_token.as_deref(), run.runtime.as_deref())).collect();
    assert_eq!(claimed, [(ids[0], Some("t0"), Some("shell")), (ids[1], Some("t1"), Some("shell"))]);
    assert_eq!(runs[0].parameters, json!({"message": "hi"}), "what to run, read in the claim");
    assert_eq!(db::execution::get(pool, ids[2]).await.unwrap().unwrap().status, Scheduled, "another's");
    assert!(
        db::execution::worker::claim(pool, mine, &claims, Patience::Surely).await.unwrap().is_empty(),
        "a second delivery of the same dispatches claims nothing"
    );

    let ok = Outcome { result: Some(json!({"ok": true})), exit_code: Some(0), ..Default::default() };
    // ids[1] with another run's token: an older run's late result must not complete this one
    let done = [(ids[0], &ok, Some("t0")), (ids[1], &ok, Some("not-t1")), (ids[2], &ok, Some("t2"))];
    let recorded = db::execution::worker::complete(pool, mine, &done, Patience::Surely).await.unwrap();
    assert_eq!(recorded.iter().map(|row| row.id).collect::<Vec<_>>(), [ids[0]]);
    let first = db::execution::get(pool, ids[0]).await.unwrap().unwrap();
    assert_eq!((first.status, first.result, first.exit_code), (Completed, Some(json!({"ok": true})), Some(0)));
    assert!(first.finished.is_some());
    assert_eq!(db::execution::get(pool, ids[1]).await.unwrap().unwrap().status, Running);
    assert!(
        db::execution::worker::complete(pool, mine, &done[..1], Patience::Surely).await.unwrap().is_empty(),
        "a duplicate success changes nothing"
    );

    // after an outage a landed write is read back by its token (and only by it), not repeated
    let landed: Vec<i64> = sqlx::query_scalar("SELECT id FROM claim_runs($1, $2, $3, true)")
        .bind(&ids[..2])
        .bind(["t0", "wrong"])
        .bind(mine)
        .fetch_all(pool)
        .await
        .unwrap();
    assert!(landed.is_empty(), "ids[0] is completed, ids[1] runs with another token: {landed:?}");
    let landed: Vec<i64> = sqlx::query_scalar("SELECT id FROM claim_runs($1, $2, $3, true)")
        .bind(&ids[1..2])
        .bind(["t1"])
        .bind(mine)
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(landed, [ids[1]]);
    let finished_before = db::execution::get(pool, ids[0]).await.unwrap().unwrap().finished;
    let landed: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM complete_runs($1, $2, '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', $3, true)",
    )
    .bind(&ids[..1])
    .bind(["t0"])
    .bind(mine)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(landed, [ids[0]]);
    assert_eq!(
        db::execution::get(pool, ids[0]).await.unwrap().unwrap().finished,
        finished_before,
        "read, not rewritten"
    );
    test.drop_database().await;
}

/// A schedule's occurrence is made by `schedule_fire`, a function of the database that the
/// executors' login may call but whose row it may not write; it restates in SQL the one
/// constructor of a first attempt (`NewExecution::first_attempt`, which the API's submissions
/// and a schedule's run now use). The two make the same row: a change of one that the other
/// does not follow fails here.
#[tokio::test]
async fn a_schedules_occurrence_is_the_first_attempt_the_api_makes() {
    use attune_common::db::schedule::NewSchedule;
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_pack(pool).await;
    let (token, _) = db::token::create_with(pool, "owner", db::token::Role::Operator, None).await.unwrap();
    // (every second, the last one due: whole seconds, as a cron occurrence is)
    let due = chrono::DurationRound::duration_trunc(chrono::Utc::now(), chrono::Duration::seconds(1)).unwrap()
        - chrono::Duration::seconds(1);
    let new_schedule = NewSchedule {
        name: "often".into(),
        action_ref: action.action_ref.clone(),
        parameters: json!({"message": "on time"}),
        cron: Some("* * * * * *".into()),
        timezone: "UTC".into(),
        at: None,
        catch_up: attune_common::schedule::CatchUp::Skip,
        paused: false,
        next_run: Some(due),
        reason: None,
        created_by: token.id,
    };
    let schedule = db::schedule::create(pool, &new_schedule).await.unwrap().unwrap();
    let default_timeout = 123;
    let look = db::schedule::run_due(pool, 10, default_timeout).await.unwrap();
    let fired = look.ran.first().unwrap_or_else(|| panic!("an occurrence is due: {look:?}"));
    let made = db::execution::get(pool, fired.execution).await.unwrap().unwrap();

    let expected = NewExecution::first_attempt(&action, schedule.parameters.clone(), json!({}), default_timeout)
        .of_schedule(schedule.id, &schedule.name, fired.scheduled_for);
    assert_eq!(made.action, expected.action);
    assert_eq!(made.action_ref, expected.action_ref);
    assert_eq!(made.runtime, expected.runtime);
    assert_eq!(made.parameters, expected.parameters);
    assert_eq!(made.status, expected.status);
    assert_eq!(made.max_retries, Some(expected.max_retries));
    assert_eq!(made.timeout_seconds, Some(expected.timeout_seconds));
    assert_eq!(made.retry_count, expected.retry_count);
    assert_eq!(made.retry_reason, expected.retry_reason);
    assert_eq!(made.original_execution, expected.original_execution);
    assert_eq!((made.schedule, made.scheduled_for), (Some(schedule.id), Some(fired.scheduled_for)));
    assert_eq!(made.submitted_by, Some(token.id), "submitted by the schedule's owner");
    // the config as the insert records it, the time read as a time (PostgreSQL and chrono may
    // write the same instant with other digits)
    let at = |config: &serde_json::Value| {
        let mut config = config.clone();
        let text = config["scheduled_for"].take();
        let time = text.as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.to_utc());
        (config, time)
    };
    assert_eq!(at(&made.config), at(&expected.recorded_config()));
    assert_eq!(at(&made.config).1, Some(fired.scheduled_for));
    test.drop_database().await;
}
