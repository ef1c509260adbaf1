//! The circuit breaker on the real PostgreSQL, step by step: failures open it at the rate, a
//! retry made while it is open waits for the end of the open period, the scheduler's claim
//! leaves the action's waiting executions alone, the period's end lets exactly one trial
//! through, the trial's failure opens it again and its success closes it.

use attune_common::db::execution::Patience;
use attune_common::db::{self, execution::NewExecution, execution::Outcome};
use attune_core::retry::RetrySettings;
use attune_core::{ExecutionStatus, FailureKind};
use attune_executor::retry_manager::RetryManager;
use attune_testkit::TestDb;
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;

/// An action whose policy opens its circuit when 3 of at least 3 executions failed in a minute,
/// for `open_secs`.
async fn guarded_action(pool: &PgPool, open_secs: f64) -> i64 {
    let pack: i64 = sqlx::query_scalar("INSERT INTO pack (ref, version) VALUES ('t', '1') RETURNING id")
        .fetch_one(pool)
        .await
        .unwrap();
    let policy = json!({"base_delay_secs": 0.1, "jitter": 0.0,
        "circuit": {"failure_rate": 1.0, "window_secs": 60, "min_executions": 3, "open_secs": open_secs}});
    sqlx::query_scalar(
        "INSERT INTO action (ref, pack, name, runtime, entrypoint, max_retries, retry_policy) \
         VALUES ('t.flaky', $1, 'flaky', 'shell', 'x.sh', 5, $2) RETURNING id",
    )
    .bind(pack)
    .bind(policy)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn request(action: i64) -> NewExecution {
    NewExecution {
        action: Some(action),
        action_ref: "t.flaky".into(),
        runtime: Some("shell".into()),
        parameters: json!({}),
        config: json!({}),
        status: ExecutionStatus::Requested,
        max_retries: 5,
        timeout_seconds: 30,
        retry_count: 0,
        retry_reason: None,
        original_execution: None,
        not_before: None,
        idempotency_key: None,
        trace_parent: None,
        occurrence: None,
    }
}

struct Circuit {
    state: String,
    open_until: Option<DateTime<Utc>>,
    trial: Option<i64>,
}

async fn circuit(pool: &PgPool, action: i64) -> Circuit {
    let (state, open_until, trial) =
        sqlx::query_as("SELECT state, open_until, trial FROM action_circuit WHERE action = $1")
            .bind(action)
            .fetch_one(pool)
            .await
            .unwrap();
    Circuit { state, open_until, trial }
}

/// Claims what the scheduler would for one free slot on `worker`.
async fn claim(pool: &PgPool, worker: i64) -> Vec<i64> {
    db::execution::scheduler::claim_waiting(
        pool,
        "shell",
        &[worker, worker, worker],
        chrono::Utc::now(),
        Patience::Once,
    )
    .await
    .unwrap()
    .iter()
    .map(|c| c.id)
    .collect()
}

/// Runs `id` on `worker` and fails it as the action's own transient failure; returns its retry.
async fn fail(pool: &PgPool, manager: &RetryManager, id: i64, worker: i64) -> Option<db::execution::Execution> {
    fail_as(pool, manager, id, worker, FailureKind::TransientError).await
}

/// Runs `id` on `worker` and fails it with `kind`; returns its retry.
async fn fail_as(
    pool: &PgPool,
    manager: &RetryManager,
    id: i64,
    worker: i64,
    kind: FailureKind,
) -> Option<db::execution::Execution> {
    sqlx::query("UPDATE execution SET status = 'running', worker = $2, started = now() WHERE id = $1")
        .bind(id)
        .bind(worker)
        .execute(pool)
        .await
        .unwrap();
    let current = db::execution::get(pool, id).await.unwrap().unwrap();
    let outcome = Outcome { failure_kind: Some(kind), exit_code: Some(75), ..Default::default() };
    let recorded = manager
        .record_failure(&current, ExecutionStatus::Failed, &[ExecutionStatus::Running], Some(worker), &outcome)
        .await
        .unwrap()
        .expect("the failure is recorded");
    recorded.retry
}

#[tokio::test]
async fn the_circuit_opens_holds_back_lets_one_trial_through_and_closes_on_its_success() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = guarded_action(pool, 0.5).await;
    let worker = db::worker::register(pool, "w", &json!({})).await.unwrap();
    let manager = RetryManager::new(pool.clone(), RetrySettings::default());

    // two failures: below min_executions, closed, retries at their backoff (100 ms)
    for _ in 0..2 {
        let id = db::execution::insert(pool, &request(action)).await.unwrap().id;
        let retry = fail(pool, &manager, id, worker).await.unwrap();
        assert_eq!(circuit(pool, action).await.state, "closed");
        let failed_at = db::execution::get(pool, id).await.unwrap().unwrap().finished.unwrap();
        assert!(retry.not_before.unwrap() - failed_at < chrono::Duration::milliseconds(500));
    }
    // the third opens it: its retry is held to the end of the open period
    let third = db::execution::insert(pool, &request(action)).await.unwrap().id;
    let held = fail(pool, &manager, third, worker).await.unwrap();
    let open = circuit(pool, action).await;
    assert_eq!(open.state, "open");
    assert_eq!(held.not_before, open.open_until, "the retry waits for the open period's end");
    let decision = db::execution::get(pool, third).await.unwrap().unwrap().retry_decision.unwrap();
    assert!(decision["reason"].as_str().unwrap().contains("circuit"), "{decision}");
    assert!(!decision["held_until"].is_null(), "{decision}");

    // while open, nothing of the action is claimed; another action's work is
    let waiting: Vec<i64> = {
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(db::execution::insert(pool, &request(action)).await.unwrap().id);
        }
        ids
    };
    assert!(claim(pool, worker).await.is_empty(), "an open circuit holds the action's waiting executions");
    assert!(db::circuit::advance(pool).await.unwrap().is_empty(), "not due yet");

    // the period ends: exactly one trial, the oldest waiting
    let open_until = open.open_until.unwrap();
    attune_testkit::wait_for("the open period to end", std::time::Duration::from_secs(5), || async {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await.unwrap();
        (now >= open_until).then_some(())
    })
    .await;
    assert_eq!(db::circuit::advance(pool).await.unwrap(), vec!["shell".to_string()]);
    let half = circuit(pool, action).await;
    assert_eq!((half.state.as_str(), half.trial), ("half_open", Some(waiting[0])));
    assert_eq!(claim(pool, worker).await, vec![waiting[0]], "only the trial is let through");
    assert!(claim(pool, worker).await.is_empty());

    // the trial fails: open again, for another period; the others still wait
    sqlx::query("UPDATE execution SET status = 'scheduled' WHERE id = $1")
        .bind(waiting[0])
        .execute(pool)
        .await
        .unwrap();
    fail(pool, &manager, waiting[0], worker).await.unwrap();
    let reopened = circuit(pool, action).await;
    assert_eq!((reopened.state.as_str(), reopened.trial), ("open", None));
    assert!(reopened.open_until.unwrap() > open_until);
    assert!(claim(pool, worker).await.is_empty());

    // the next trial completes: closed, and the rest of the waiting work flows
    let reopened_until = reopened.open_until.unwrap();
    attune_testkit::wait_for("the second open period to end", std::time::Duration::from_secs(5), || async {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await.unwrap();
        (now >= reopened_until).then_some(())
    })
    .await;
    db::circuit::advance(pool).await.unwrap();
    let trial = circuit(pool, action).await.trial.expect("a second trial");
    assert_eq!(claim(pool, worker).await, vec![trial]);
    sqlx::query("UPDATE execution SET status = 'completed', finished = now() WHERE id = $1")
        .bind(trial)
        .execute(pool)
        .await
        .unwrap();
    db::circuit::advance(pool).await.unwrap();
    assert_eq!(circuit(pool, action).await.state, "closed");
    let rest = claim(pool, worker).await;
    assert!(!rest.is_empty() && !rest.contains(&trial), "{rest:?}");
    // the failures before the close are forgotten: one more failure does not open it again
    fail(pool, &manager, rest[0], worker).await.unwrap();
    assert_eq!(circuit(pool, action).await.state, "closed");
    test.drop_database().await;
}

#[tokio::test]
async fn failures_that_say_nothing_about_the_action_do_not_count() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = guarded_action(pool, 30.0).await;
    let worker = db::worker::register(pool, "w", &json!({})).await.unwrap();
    let manager = RetryManager::new(pool.clone(), RetrySettings::default());
    for _ in 0..5 {
        let id = db::execution::insert(pool, &request(action)).await.unwrap().id;
        fail_as(pool, &manager, id, worker, FailureKind::WorkerHeartbeatStale).await;
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM action_circuit WHERE state <> 'closed'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "a vanished worker is not the action's failure");
    test.drop_database().await;
}
