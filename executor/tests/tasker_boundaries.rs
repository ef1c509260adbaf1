//! Tasker's six retry boundary tests (its `retry_boundary_tests.rs`), ported: `max_attempts`
//! counts every attempt, the first included; `retryable: false` never retries; the first attempt
//! always runs. Each case registers an action from YAML through the pack loader, as a pack
//! author writes it, and checks the three places that must agree: the scheduler's claim (does an
//! attempt run), `retry::decide` (Rust) and `is_execution_retriable` (SQL).

use attune_common::db::execution::Patience;
use attune_common::db::{self, action::Action, execution::NewExecution};
use attune_common::pack::load_pack;
use attune_core::retry::{EffectivePolicy, FailedAttempt, RetryDecision, RetrySettings, decide};
use attune_core::{ExecutionStatus, FailureKind};
use attune_testkit::TestDb;
use serde_json::json;
use sqlx::PgPool;

struct Case {
    test: TestDb,
    action: Action,
    warnings: Vec<String>,
    _dir: tempdir::Dir,
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Registers `tasker.step` with `retry` as its `retry:` block.
async fn case(retry: &str) -> Case {
    let dir = std::env::temp_dir().join(format!("attune-tasker-{}", rand::random::<u64>()));
    std::fs::create_dir_all(dir.join("actions")).unwrap();
    std::fs::write(dir.join("pack.yaml"), "ref: tasker\nversion: 1.0.0\n").unwrap();
    std::fs::write(dir.join("actions/step.sh"), "exit 75\n").unwrap();
    let yaml = format!("name: step\nruntime: shell\nentrypoint: actions/step.sh\nretry:\n{retry}");
    std::fs::write(dir.join("actions/step.yaml"), yaml).unwrap();
    let pack = load_pack(&dir).unwrap();
    let warnings = pack.actions[0].warnings.clone();
    let test = TestDb::new().await;
    db::pack::register(&test.pool, &pack).await.unwrap();
    let action = db::action::get_by_ref(&test.pool, "tasker.step").await.unwrap().unwrap();
    Case { test, action, warnings, _dir: tempdir::Dir(dir) }
}

impl Case {
    /// Attempt `attempts + 1` of the chain (`attempts` = Tasker's count of attempts already made),
    /// waiting for a worker.
    async fn attempt(&self, attempts: i32) -> i64 {
        let new = NewExecution {
            action: Some(self.action.id),
            action_ref: self.action.action_ref.clone(),
            runtime: Some(self.action.runtime.clone()),
            parameters: json!({}),
            config: json!({}),
            status: ExecutionStatus::Requested,
            max_retries: self.action.max_retries.unwrap_or(0),
            timeout_seconds: 30,
            retry_count: attempts,
            retry_reason: None,
            original_execution: None,
            not_before: None,
            idempotency_key: None,
            trace_parent: None,
            occurrence: None,
        };
        db::execution::insert(&self.test.pool, &new).await.unwrap().id
    }

    /// Whether the attempt runs: the scheduler's claim takes it for a worker.
    async fn runs(&self, execution: i64) -> bool {
        let worker = db::worker::register(&self.test.pool, &format!("w{execution}"), &json!({})).await.unwrap();
        let claimed = db::execution::scheduler::claim_waiting(
            &self.test.pool,
            "shell",
            &[worker],
            chrono::Utc::now(),
            Patience::Once,
        )
        .await
        .unwrap();
        claimed.iter().any(|c| c.id == execution)
    }

    /// Fails the attempt (transient, the kind retried by default) and answers whether it is
    /// retried, by Rust and by SQL, which must agree.
    async fn retried_after_failure(&self, execution: i64) -> bool {
        let pool: &PgPool = &self.test.pool;
        sqlx::query(
            "UPDATE execution SET status = 'failed', failure_kind = 'transient_error', exit_code = 75, \
             started = now(), finished = now() WHERE id = $1",
        )
        .bind(execution)
        .execute(pool)
        .await
        .unwrap();
        let row = db::execution::get(pool, execution).await.unwrap().unwrap();
        let stored = self.action.retry_policy.clone().map(|p| serde_json::from_value(p).unwrap());
        let policy = EffectivePolicy::resolve(&RetrySettings::default(), stored.as_ref());
        let attempt = FailedAttempt::new(FailureKind::TransientError, row.retry_count, row.max_retries.unwrap(), true);
        let rust =
            matches!(decide(&policy, &attempt, chrono::Utc::now(), &mut rand::rng()), RetryDecision::Retry { .. });
        let sql: bool =
            sqlx::query_scalar("SELECT is_execution_retriable($1)").bind(execution).fetch_one(pool).await.unwrap();
        assert_eq!(rust, sql, "decide and is_execution_retriable disagree on attempt {}", row.retry_count + 1);
        rust
    }
}

#[tokio::test]
async fn test_max_attempts_zero_allows_first_execution() {
    let case = case("  max_attempts: 0\n").await;
    assert!(
        case.warnings.iter().any(|w| w.contains("retry.max_attempts") && w.contains("configuration error")),
        "the loader warns: {:?}",
        case.warnings
    );
    let first = case.attempt(0).await;
    assert!(case.runs(first).await, "max_attempts: 0 still lets the first attempt run");
    case.test.drop_database().await;
}

#[tokio::test]
async fn test_max_attempts_zero_blocks_after_first() {
    let case = case("  max_attempts: 0\n").await;
    let first = case.attempt(0).await;
    assert!(!case.retried_after_failure(first).await, "nothing after the first attempt");
    case.test.drop_database().await;
}

#[tokio::test]
async fn test_max_attempts_one_semantics() {
    let case = case("  max_attempts: 1\n").await;
    assert!(case.warnings.is_empty(), "{:?}", case.warnings);
    assert_eq!(case.action.max_retries, Some(0), "1 attempt = no retries");
    let first = case.attempt(0).await;
    assert!(case.runs(first).await);
    assert!(!case.retried_after_failure(first).await, "exactly one attempt");
    case.test.drop_database().await;
}

#[tokio::test]
async fn test_max_attempts_three_progression() {
    let case = case("  retryable: true\n  max_attempts: 3\n").await;
    assert_eq!(case.action.max_retries, Some(2));
    // attempts already made → retried after this one fails?
    let mut progression = Vec::new();
    for attempts in 0..4 {
        let execution = case.attempt(attempts).await;
        progression.push(case.retried_after_failure(execution).await);
    }
    // attempt 1 → retry, attempt 2 → retry, attempt 3 → exhausted (3 >= 3)
    assert_eq!(progression, [true, true, false, false]);
    case.test.drop_database().await;
}

#[tokio::test]
async fn test_first_attempt_ignores_retryable_flag() {
    let case = case("  retryable: false\n  max_attempts: 3\n").await;
    assert!(case.warnings.iter().any(|w| w.contains("retry.retryable")), "{:?}", case.warnings);
    let first = case.attempt(0).await;
    assert!(case.runs(first).await, "retryable: false does not affect the first attempt");
    case.test.drop_database().await;
}

#[tokio::test]
async fn test_retries_require_retryable_true() {
    let case = case("  retryable: false\n  max_attempts: 3\n").await;
    assert_eq!(case.action.max_retries, Some(0), "retryable: false is max_attempts: 1 in effect");
    let first = case.attempt(0).await;
    assert!(!case.retried_after_failure(first).await, "no retry with retryable: false");
    // even an attempt that was made (by hand) with budget left is not retried automatically
    let second = case.attempt(1).await;
    sqlx::query("UPDATE execution SET max_retries = 5 WHERE id = $1")
        .bind(second)
        .execute(&case.test.pool)
        .await
        .unwrap();
    assert!(!case.retried_after_failure(second).await);
    let retryable = self::case("  retryable: true\n  max_attempts: 3\n").await;
    let first = retryable.attempt(0).await;
    assert!(retryable.retried_after_failure(first).await, "the same budget with retryable: true retries");
    case.test.drop_database().await;
    retryable.test.drop_database().await;
}

#[test]
fn max_retries_and_max_attempts_together_is_a_load_error_naming_both() {
    let err = attune_core::pack::parse_action(
        std::path::Path::new("p"),
        std::path::Path::new("p/actions/a.yaml"),
        "name: a\nruntime: shell\nentrypoint: a.sh\nmax_retries: 2\nretry:\n  max_attempts: 3\n",
        |_| true,
    )
    .unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains("p/actions/a.yaml") && shown.contains("'max_retries'"), "{shown}");
    assert!(shown.contains("retry.max_attempts"), "{shown}");
}
