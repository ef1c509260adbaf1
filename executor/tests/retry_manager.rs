//! The RetryManager on the real PostgreSQL: one retry per failure under concurrency, and
//! `is_execution_retriable` (SQL) agreeing with `retry::decide` (Rust) on random executions.

use attune_common::db::{self, execution::NewExecution, execution::Outcome};
use attune_common::retry::{EffectivePolicy, FailedAttempt, RetryConfig, RetryDecision, decide};
use attune_common::{ExecutionStatus, FailureKind};
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
        parameters: json!({}),
        config: json!({}),
        status: ExecutionStatus::Requested,
        max_retries,
        timeout_seconds: 30,
        retry_count,
        retry_reason: None,
        original_execution: None,
        not_before: None,
    }
}

/// A registered, heartbeating worker offering the shell runtime.
async fn active_worker(pool: &PgPool, name: &str) -> i64 {
    let capabilities = json!({"runtimes": ["shell"], "health": {"consecutive_failures": 0}});
    let id = db::worker::register(pool, name, &capabilities).await.unwrap();
    db::worker::heartbeat(pool, id, &capabilities).await.unwrap();
    id
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
    let manager = std::sync::Arc::new(RetryManager::new(pool.clone(), RetryConfig::default()));
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
            Outcome { failure_kind: Some("transient_error".into()), exit_code: Some(75), ..Default::default() };
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

#[tokio::test]
async fn sql_and_rust_agree_on_retry_eligibility() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let mut rng = StdRng::seed_from_u64(0x2e7a1);
    let config = RetryConfig::default();
    let kinds: Vec<FailureKind> = FailureKind::ALL.into_iter().filter(|k| *k != FailureKind::Canceled).collect();
    let mut policies: Vec<(i64, Option<attune_common::pack::RetryPolicy>)> = Vec::new();
    for i in 0..12 {
        let policy = match i % 4 {
            0 => None,
            _ => {
                let on: Option<Vec<FailureKind>> =
                    rng.random_bool(0.6).then(|| kinds.iter().copied().filter(|_| rng.random_bool(0.4)).collect());
                let idempotent = if rng.random_bool(0.5) { Some(rng.random_bool(0.5)) } else { None };
                Some(attune_common::pack::RetryPolicy { on, idempotent, ..Default::default() })
            }
        };
        let stored = policy.as_ref().map(|p| serde_json::to_value(p).unwrap());
        policies.push((action(pool, &format!("a{i}"), stored).await, policy));
    }
    let statuses = [
        ExecutionStatus::Failed,
        ExecutionStatus::Timeout,
        ExecutionStatus::Completed,
        ExecutionStatus::Abandoned,
        ExecutionStatus::Canceled,
    ];
    let mut retriable = 0;
    for _ in 0..1000 {
        let (action, policy) = &policies[rng.random_range(0..policies.len())];
        let status = statuses[rng.random_range(0..statuses.len())];
        let kind = rng.random_bool(0.95).then(|| kinds[rng.random_range(0..kinds.len())]);
        let retry_count = rng.random_range(0..4);
        let max_retries = rng.random_range(0..4);
        let started = rng.random_bool(0.5);
        let execution = db::execution::insert(pool, &new(*action, retry_count, max_retries)).await.unwrap();
        sqlx::query(
            "UPDATE execution SET status = $2, failure_kind = $3, finished = now(), \
             started = CASE WHEN $4 THEN now() END WHERE id = $1",
        )
        .bind(execution.id)
        .bind(status)
        .bind(kind.map(|k| k.as_str()))
        .bind(started)
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
        let rust = matches!(status, ExecutionStatus::Failed | ExecutionStatus::Timeout) && !already_retried && {
            // as the RetryManager reads it: no kind is the action's own failure
            let failure = kind.unwrap_or(FailureKind::ActionFailed);
            let attempt = FailedAttempt { failure, retry_count, max_retries, started };
            matches!(decide(&effective, &attempt, chrono::Utc::now(), &mut rng), RetryDecision::Retry { .. })
        };
        assert_eq!(
            sql, rust,
            "{status} {kind:?} {retry_count}/{max_retries} started={started} retried={already_retried} {policy:?}"
        );
        retriable += usize::from(rust);
    }
    assert!(retriable > 30, "the sample exercises both answers ({retriable} retriable)");
    test.drop_database().await;
}

#[tokio::test]
async fn concurrent_decisions_spread_before_the_database_can_count_them() {
    use attune_common::health::HealthProbeConfig;
    use attune_executor::health_probe::WorkerHealthProbe;
    let test = TestDb::new().await;
    let pool = test.pool.clone();
    let (a, b) = (active_worker(&pool, "a").await, active_worker(&pool, "b").await);
    // b has one execution in flight; a none
    let action = action(&pool, "busy", None).await;
    running_on(&pool, action, b).await;
    let probe = WorkerHealthProbe::new(pool.clone(), HealthProbeConfig::default());
    // 41 decisions made before any of them is committed (as under a burst)
    let mut held = Vec::new();
    for _ in 0..41 {
        held.push(probe.select_worker("shell").await.unwrap().unwrap());
    }
    let to_a = held.iter().filter(|(r, _)| r.worker_id == a).count();
    assert_eq!((to_a, 41 - to_a), (21, 20), "depths equalise: a 0 + 21, b 1 + 20");
    drop(held);
    // released: the next decision sees the database alone again (a is emptier)
    let (next, _reservation) = probe.select_worker("shell").await.unwrap().unwrap();
    assert_eq!(next.worker_id, a);
    test.drop_database().await;
}

#[tokio::test]
async fn a_cached_fleet_still_sees_fresh_in_flight_counts() {
    use attune_common::health::HealthProbeConfig;
    use attune_executor::health_probe::WorkerHealthProbe;
    let test = TestDb::new().await;
    let pool = test.pool.clone();
    let (a, b) = (active_worker(&pool, "a").await, active_worker(&pool, "b").await);
    let probe = WorkerHealthProbe::new(pool.clone(), HealthProbeConfig::default())
        .with_fleet_cache(std::time::Duration::from_secs(60));
    drop(probe.select_worker("shell").await.unwrap().unwrap()); // reads and caches the fleet
    // a gets three executions in flight: the next decisions go to b although the fleet is cached
    let action = action(&pool, "busy", None).await;
    for _ in 0..3 {
        running_on(&pool, action, a).await;
    }
    for _ in 0..3 {
        let (chosen, _reservation) = probe.select_worker("shell").await.unwrap().unwrap();
        assert_eq!(chosen.worker_id, b);
    }
    // a worker registered after the fleet was cached is not seen until the cache expires
    for _ in 0..3 {
        running_on(&pool, action, b).await;
    }
    let c = active_worker(&pool, "c").await;
    let (chosen, _reservation) = probe.select_worker("shell").await.unwrap().unwrap();
    assert_ne!(chosen.worker_id, c);
    let fresh = WorkerHealthProbe::new(pool.clone(), HealthProbeConfig::default());
    let (chosen, _reservation) = fresh.select_worker("shell").await.unwrap().unwrap();
    assert_eq!(chosen.worker_id, c, "an uncached probe sees the new, idle worker");
    test.drop_database().await;
}

#[tokio::test]
async fn a_shared_in_flight_read_still_counts_every_choice_of_this_executor() {
    use attune_common::health::HealthProbeConfig;
    use attune_executor::health_probe::WorkerHealthProbe;
    let test = TestDb::new().await;
    let pool = test.pool.clone();
    let (a, b) = (active_worker(&pool, "a").await, active_worker(&pool, "b").await);
    let action = action(&pool, "busy", None).await;
    for _ in 0..5 {
        running_on(&pool, action, b).await;
    }
    let probe = WorkerHealthProbe::new(pool.clone(), HealthProbeConfig::default())
        .with_inflight_cache(std::time::Duration::from_secs(60));
    let (first, reservation) = probe.select_worker("shell").await.unwrap().unwrap();
    assert_eq!((first.worker_id, first.queue_depth), (a, 0));
    // the choice commits and its reservation is released; another executor's choice of a commits
    running_on(&pool, action, a).await;
    drop(reservation);
    running_on(&pool, action, a).await;
    // the kept read (a 0) predates both: the released reservation still counts, the other
    // executor's choice is not seen yet
    let (second, _held) = probe.select_worker("shell").await.unwrap().unwrap();
    assert_eq!((second.worker_id, second.queue_depth), (a, 1));
    // a probe that reads afresh sees both
    let fresh = WorkerHealthProbe::new(pool.clone(), HealthProbeConfig::default());
    let (chosen, _reservation) = fresh.select_worker("shell").await.unwrap().unwrap();
    assert_eq!((chosen.worker_id, chosen.queue_depth), (a, 2));
    test.drop_database().await;
}
