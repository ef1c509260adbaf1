//! The RetryManager on the real PostgreSQL: one retry per failure under concurrency, and
//! `is_execution_retriable` (SQL) agreeing with `retry::decide` (Rust) on random executions.

use attune_common::db::execution::Patience;
use attune_common::db::{self, execution::NewExecution, execution::Outcome};
use attune_common::pack::{ResultMatch, RetryPolicy, RetryRule, RuleDo, RuleThen, RuleWhen};
use attune_core::retry::{EffectivePolicy, FailedAttempt, RetryDecision, RetrySettings, decide};
use attune_core::{ExecutionStatus, FailureKind};
use attune_executor::retry_manager::RetryManager;
use attune_testkit::TestDb;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use sqlx::PgPool;

async fn action(pool: &PgPool, name: &str, policy: Option<Value>) -> i64 {
    let pack: i64 = sqlx::query_scalar(
        "INSERT INTO pack (ref, version) VALUES ('t', '1') ON CONFLICT (ref) DO UPDATE SET version = '1' RETURNING id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query_scalar(
        "INSERT INTO action (ref, pack, name, runtime, entrypoint, max_retries, retry_policy) \
         VALUES ($1, $2, $3, 'shell', 'x.sh', 3, $4) RETURNING id",
    )
    .bind(format!("t.{name}"))
    .bind(pack)
    .bind(name)
    .bind(policy)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn new(action: i64, retry_count: i32, max_retries: i32) -> NewExecution {
    NewExecution {
        action: Some(action),
        action_ref: "t.a".into(),
        runtime: None,
        parameters: json!({}),
        config: json!({}),
        status: ExecutionStatus::Requested,
        max_retries,
        timeout_seconds: 30,
        retry_count,
        retry_reason: None,
        original_execution: None,
        not_before: None,
        idempotency_key: None,
        trace_parent: None,
        occurrence: None,
    }
}

/// An execution of `action` running on `worker`.
async fn running_on(pool: &PgPool, action: i64, worker: i64) -> i64 {
    let execution = db::execution::insert(pool, &new(action, 0, 0)).await.unwrap();
    sqlx::query("UPDATE execution SET status = 'running', worker = $2, started = now() WHERE id = $1")
        .bind(execution.id)
        .bind(worker)
        .execute(pool)
        .await
        .unwrap();
    execution.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reports_of_one_failure_create_exactly_one_retry() {
    let test = TestDb::new().await;
    let pool = test.pool.clone();
    let action = action(&pool, "a", None).await;
    let worker = db::worker::register(&pool, "w", &json!({})).await.unwrap();
    let manager = std::sync::Arc::new(RetryManager::new(pool.clone(), RetrySettings::default()));
    for _ in 0..20 {
        let execution = db::execution::insert(&pool, &new(action, 0, 3)).await.unwrap();
        sqlx::query("UPDATE execution SET status = 'running', worker = $2, started = now() WHERE id = $1")
            .bind(execution.id)
            .bind(worker)
            .execute(&pool)
            .await
            .unwrap();
        let current = db::execution::get(&pool, execution.id).await.unwrap().unwrap();
        let outcome =
            Outcome { failure_kind: Some(FailureKind::TransientError), exit_code: Some(75), ..Default::default() };
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (manager, current, outcome) = (manager.clone(), current.clone(), outcome.clone());
                tokio::spawn(async move {
                    manager
                        .record_failure(
                            &current,
                            ExecutionStatus::Failed,
                            &[ExecutionStatus::Running],
                            Some(worker),
                            &outcome,
                        )
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut applied = 0;
        for task in tasks {
            if let Some(recorded) = task.await.unwrap() {
                applied += 1;
                let retry = recorded.retry.expect("a transient failure with budget left is retried");
                assert_eq!((retry.status, retry.retry_count), (ExecutionStatus::Delayed, 1));
                assert!(retry.not_before.unwrap() > recorded.execution.finished.unwrap());
            }
        }
        assert_eq!(applied, 1);
        let retries: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE original_execution = $1")
            .bind(execution.id)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(retries, 1);
    }
    test.drop_database().await;
}

/// A random `retry.rules` list over the conditions the executions below are drawn from.
fn random_rules(rng: &mut StdRng, kinds: &[FailureKind]) -> Option<Vec<RetryRule>> {
    if rng.random_bool(0.3) {
        return None;
    }
    let pick = |all: &[i32], rng: &mut StdRng| -> Option<Vec<i32>> {
        rng.random_bool(0.4).then(|| all.iter().copied().filter(|_| rng.random_bool(0.5)).collect())
    };
    let rules = (0..rng.random_range(1..4))
        .map(|_| {
            let result = rng.random_bool(0.3).then(|| match rng.random_range(0..3) {
                0 => ResultMatch {
                    path: "error.code".into(),
                    equals: None,
                    one_of: Some(vec![json!("busy"), json!("x")]),
                },
                1 => ResultMatch { path: "items.0".into(), equals: Some(json!(1)), one_of: None },
                _ => ResultMatch { path: "error".into(), equals: Some(json!({"code": "busy"})), one_of: None },
            });
            let when = RuleWhen {
                exit_codes: pick(&[1, 2, 3, 75], rng),
                failure_kinds: rng
                    .random_bool(0.4)
                    .then(|| kinds.iter().copied().filter(|k| !k.is_never_retried() && rng.random_bool(0.3)).collect()),
                http_status: pick(&[404, 429, 503], rng),
                result,
            };
            let action = if rng.random_bool(0.3) { RuleDo::Fail } else { RuleDo::Retry };
            let attempts = (action == RuleDo::Retry && rng.random_bool(0.6)).then(|| rng.random_range(1..5));
            RetryRule {
                when,
                then: RuleThen {
                    action,
                    attempts,
                    backoff: None,
                    delay_secs: None,
                    max_delay_secs: None,
                    multiplier: None,
                    jitter: None,
                },
            }
        })
        .collect();
    Some(rules)
}

#[tokio::test]
async fn sql_and_rust_agree_on_retry_eligibility() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let mut rng = StdRng::seed_from_u64(0x2e7a1);
    let config = RetrySettings::default();
    let kinds: Vec<FailureKind> = FailureKind::ALL.into_iter().filter(|k| *k != FailureKind::Canceled).collect();
    let mut policies: Vec<(i64, Option<RetryPolicy>)> = Vec::new();
    for i in 0..24 {
        let policy = match i % 4 {
            0 => None,
            _ => {
                let on: Option<Vec<FailureKind>> =
                    rng.random_bool(0.6).then(|| kinds.iter().copied().filter(|_| rng.random_bool(0.4)).collect());
                let idempotent = if rng.random_bool(0.5) { Some(rng.random_bool(0.5)) } else { None };
                let retryable = rng.random_bool(0.2).then(|| rng.random_bool(0.5));
                Some(RetryPolicy {
                    on,
                    idempotent,
                    retryable,
                    rules: random_rules(&mut rng, &kinds),
                    ..Default::default()
                })
            }
        };
        let stored = policy.as_ref().map(|p| serde_json::to_value(p).unwrap());
        policies.push((action(pool, &format!("a{i}"), stored).await, policy));
    }
    let statuses = [
        ExecutionStatus::Failed,
        ExecutionStatus::Failed,
        ExecutionStatus::Timeout,
        ExecutionStatus::Completed,
        ExecutionStatus::Canceled,
        ExecutionStatus::Abandoned,
    ];
    let results =
        [None, Some(json!({"error": {"code": "busy"}})), Some(json!({"items": [1.0]})), Some(json!({"error": "busy"}))];
    let mut retriable = 0;
    let mut by_rule = 0;
    for _ in 0..1500 {
        let (action, policy) = &policies[rng.random_range(0..policies.len())];
        let status = statuses[rng.random_range(0..statuses.len())];
        let kind = rng.random_bool(0.95).then(|| kinds[rng.random_range(0..kinds.len())]);
        let retry_count = rng.random_range(0..4);
        // -1: unlimited
        let max_retries = rng.random_range(-1..4);
        let started = rng.random_bool(0.5);
        let exit_code = [None, Some(1), Some(3), Some(75)][rng.random_range(0..4)];
        let http_status = [None, Some(404), Some(429), Some(503)][rng.random_range(0..4)];
        let result = results[rng.random_range(0..results.len())].clone();
        let execution = db::execution::insert(pool, &new(*action, retry_count, max_retries)).await.unwrap();
        sqlx::query(
            "UPDATE execution SET status = $2, failure_kind = $3, finished = now(), \
             started = CASE WHEN $4 THEN now() END, exit_code = $5, http_status = $6, result = $7 WHERE id = $1",
        )
        .bind(execution.id)
        .bind(status)
        .bind(kind.map(|k| k.as_str()))
        .bind(started)
        .bind(exit_code)
        .bind(http_status)
        .bind(&result)
        .execute(pool)
        .await
        .unwrap();
        let already_retried = rng.random_bool(0.2);
        if already_retried {
            let mut retry = new(*action, retry_count + 1, max_retries);
            retry.original_execution = Some(execution.id);
            db::execution::insert(pool, &retry).await.unwrap();
        }
        let sql: bool =
            sqlx::query_scalar("SELECT is_execution_retriable($1)").bind(execution.id).fetch_one(pool).await.unwrap();
        let effective = EffectivePolicy::resolve(&config, policy.as_ref());
        // as the RetryManager reads it: no kind is the action's own failure
        let attempt = FailedAttempt {
            exit_code,
            http_status,
            result: result.clone(),
            ..FailedAttempt::new(kind.unwrap_or(FailureKind::ActionFailed), retry_count, max_retries, started)
        };
        let rust = matches!(status, ExecutionStatus::Failed | ExecutionStatus::Timeout) && !already_retried && {
            matches!(decide(&effective, &attempt, chrono::Utc::now(), &mut rng), RetryDecision::Retry { .. })
        };
        assert_eq!(
            sql, rust,
            "{status} {kind:?} {retry_count}/{max_retries} started={started} retried={already_retried} \
             exit={exit_code:?} http={http_status:?} result={result:?} {policy:?}"
        );
        retriable += usize::from(rust);
        by_rule += usize::from(rust && effective.matching_rule(&attempt).is_some());
    }
    assert!(retriable > 60, "the sample exercises both answers ({retriable} retriable)");
    assert!(by_rule > 15, "the sample exercises the rules ({by_rule} retried by a rule)");
    test.drop_database().await;
}

/// A worker offering the shell runtime with `slots` slots, `consuming` or not.
async fn worker_with_slots(pool: &PgPool, name: &str, slots: i64, consuming: bool) -> i64 {
    let capabilities = json!({"runtimes": ["shell"], "slots": slots, "consuming": consuming, "health": {}});
    let id = db::worker::register(pool, name, &capabilities).await.unwrap();
    db::worker::heartbeat(pool, id, &capabilities).await.unwrap();
    id
}

#[tokio::test]
async fn the_picture_gives_room_by_free_slots_and_skips_workers_that_cannot_consume_or_are_draining() {
    use attune_core::health::HealthThresholds;
    use attune_executor::health_probe::WorkerHealthProbe;
    let test = TestDb::new().await;
    let pool = test.pool.clone();
    let a = worker_with_slots(&pool, "a", 3, true).await;
    let b = worker_with_slots(&pool, "b", 2, true).await;
    let _c = worker_with_slots(&pool, "c", 8, false).await;
    let d = worker_with_slots(&pool, "d", 8, true).await;
    db::worker::drain(&pool, d).await.unwrap();
    db::worker::heartbeat(&pool, d, &json!({"runtimes": ["shell"], "slots": 8, "health": {}})).await.unwrap();
    let action = action(&pool, "busy", None).await;
    running_on(&pool, action, a).await;
    running_on(&pool, action, a).await;
    running_on(&pool, action, b).await;
    running_on(&pool, action, b).await;
    let probe = WorkerHealthProbe::new(pool.clone(), HealthThresholds::default());
    let mut picture = probe.picture().await.unwrap();
    let rooms: Vec<(i64, i64)> = picture.rooms(probe.config(), "shell").iter().map(|r| (r.worker_id, r.free)).collect();
    assert_eq!(rooms, vec![(a, 1)], "b is full; c does not consume; d is draining (and stays so)");
    assert!(picture.rooms(probe.config(), "python").is_empty());
    picture.add(a, 1);
    assert!(picture.rooms(probe.config(), "shell").is_empty(), "a claim counts at once");
    assert!(picture.could_run(probe.config(), "shell"), "busy workers could still take work");
    assert!(!picture.could_run(probe.config(), "python"));
    assert_eq!(probe.select_worker("shell").await.unwrap().map(|r| r.worker_id), Some(a));
    test.drop_database().await;
}

#[tokio::test]
async fn waiting_requests_are_claimed_oldest_first_per_runtime_by_the_plan_and_handed_back_fenced() {
    let test = TestDb::new().await;
    let pool = test.pool.clone();
    let (a, b) = (worker_with_slots(&pool, "a", 4, true).await, worker_with_slots(&pool, "b", 4, true).await);
    let shell = action(&pool, "sh", None).await;
    let python = action(&pool, "py", None).await;
    sqlx::query("UPDATE action SET runtime = 'python' WHERE id = $1").bind(python).execute(&pool).await.unwrap();
    let mut shell_ids = Vec::new();
    for _ in 0..5 {
        shell_ids.push(db::execution::insert(&pool, &new(shell, 0, 0)).await.unwrap().id);
        db::execution::insert(&pool, &new(python, 0, 0)).await.unwrap();
    }
    // a retry whose backoff began before them all goes first: it waits by its not_before
    let early = chrono::Utc::now() - chrono::Duration::minutes(5);
    let retry =
        db::execution::insert(&pool, &NewExecution { not_before: Some(early), ..new(shell, 1, 3) }).await.unwrap();
    assert_eq!(retry.runtime.as_deref(), Some("shell"), "the runtime is copied from the action on insert");
    assert_eq!(
        db::execution::scheduler::waiting_runtimes(&pool).await.unwrap(),
        vec!["python".to_string(), "shell".to_string()]
    );

    // another executor holds the oldest plain request: it is skipped, not waited for
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM execution WHERE id = $1 FOR UPDATE")
        .bind(shell_ids[0])
        .execute(&mut *other)
        .await
        .unwrap();
    let claimed =
        db::execution::scheduler::claim_waiting(&pool, "shell", &[a, b, a], chrono::Utc::now(), Patience::Once)
            .await
            .unwrap();
    other.rollback().await.unwrap();
    let mut got: Vec<(i64, i64)> = claimed.iter().map(|c| (c.id, c.worker)).collect();
    got.sort();
    let mut expected = vec![(retry.id, a), (shell_ids[1], b), (shell_ids[2], a)];
    expected.sort();
    assert_eq!(got, expected, "oldest first (the retry by its not_before), in the plan's order, locked rows skipped");
    let status: Vec<ExecutionStatus> =
        sqlx::query_scalar("SELECT status FROM execution WHERE runtime = 'python'").fetch_all(&pool).await.unwrap();
    assert!(status.iter().all(|s| *s == ExecutionStatus::Requested), "another runtime's requests are untouched");

    // fewer waiting than the plan: what is there, no more
    let rest =
        db::execution::scheduler::claim_waiting(&pool, "shell", &[a, b, a, b, a], chrono::Utc::now(), Patience::Once)
            .await
            .unwrap();
    assert_eq!(rest.len(), 3);

    // the hand-back is fenced by the worker and clears the assignment
    let on_b = rest.iter().find(|c| c.worker == b).unwrap().id;
    assert!(db::execution::hand_back(&pool, on_b, a).await.unwrap().is_none(), "only its worker hands it back");
    assert!(db::execution::hand_back(&pool, on_b, b).await.unwrap().is_some());
    let back = db::execution::get(&pool, on_b).await.unwrap().unwrap();
    assert_eq!((back.status, back.worker, back.retry_count), (ExecutionStatus::Requested, None, 0));
    assert_eq!(
        db::execution::scheduler::claim_waiting(&pool, "shell", &[b], chrono::Utc::now(), Patience::Once)
            .await
            .unwrap()[0]
            .id,
        on_b
    );
    test.drop_database().await;
}
