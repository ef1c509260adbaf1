//! `db::idempotency` on the real PostgreSQL, a fresh database per test: a key is claimed once per
//! token while it lives, an expired one is replaced, a claim racing an uncommitted one waits for
//! it, and the cleanup deletes expired records a batch at a time.

use std::time::Duration;

use attune_common::db::{self, idempotency::Record};
use attune_common::pack::load_pack;
use attune_testkit::TestDb;
use sqlx::PgPool;

async fn core_echo(pool: &PgPool) -> db::action::Action {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    db::pack::register(pool, &load_pack(&dir).unwrap()).await.unwrap();
    db::action::get_by_ref(pool, "core.echo").await.unwrap().unwrap()
}

async fn token(pool: &PgPool, name: &str) -> i64 {
    let token = db::token::create(pool, name).await.unwrap();
    db::token::verify(pool, &token).await.unwrap().unwrap()
}

async fn execution(pool: &PgPool, action: &db::action::Action) -> i64 {
    db::execution::insert(pool, &attune_testkit::echo_execution(action)).await.unwrap().id
}

/// Makes the record of `key` `age` old (test set-up only).
async fn backdate(pool: &PgPool, key: &str, age: Duration) {
    sqlx::query("UPDATE api_idempotency_key SET created = now() - make_interval(secs => $2) WHERE key = $1")
        .bind(key)
        .bind(age.as_secs_f64())
        .execute(pool)
        .await
        .unwrap();
}

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_key_is_claimed_once_per_token_while_it_lives() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_echo(pool).await;
    let (alice, bob) = (token(pool, "alice").await, token(pool, "bob").await);
    let (first, second, third) =
        (execution(pool, &action).await, execution(pool, &action).await, execution(pool, &action).await);
    let (one, two) = (vec![1u8; 32], vec![2u8; 32]);

    assert!(db::idempotency::claim(pool, alice, "k", &one, first).await.unwrap());
    let recorded = Some(Record { execution: first, request_sha256: one.clone() });
    assert_eq!(db::idempotency::find(pool, alice, "k").await.unwrap(), recorded);
    // taken: nothing changes, whatever the second claim brings
    assert!(!db::idempotency::claim(pool, alice, "k", &two, second).await.unwrap());
    assert_eq!(db::idempotency::find(pool, alice, "k").await.unwrap(), recorded);
    // another token's keys are its own
    assert!(db::idempotency::claim(pool, bob, "k", &two, third).await.unwrap());
    assert_eq!(
        db::idempotency::find(pool, bob, "k").await.unwrap(),
        Some(Record { execution: third, request_sha256: two })
    );
    assert_eq!(db::idempotency::find(pool, alice, "other").await.unwrap(), None);
    test.drop_database().await;
}

#[tokio::test]
async fn a_key_lives_24_hours_then_is_free_and_replaced_on_reuse() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_echo(pool).await;
    let alice = token(pool, "alice").await;
    let (first, second) = (execution(pool, &action).await, execution(pool, &action).await);
    let (one, two) = (vec![1u8; 32], vec![2u8; 32]);
    assert!(db::idempotency::claim(pool, alice, "k", &one, first).await.unwrap());

    backdate(pool, "k", 24 * HOUR - Duration::from_secs(60)).await;
    assert!(db::idempotency::find(pool, alice, "k").await.unwrap().is_some(), "a minute before it expires");
    assert!(!db::idempotency::claim(pool, alice, "k", &two, second).await.unwrap());

    backdate(pool, "k", 24 * HOUR + Duration::from_secs(1)).await;
    assert_eq!(db::idempotency::find(pool, alice, "k").await.unwrap(), None, "a second after it expired");
    assert!(db::idempotency::claim(pool, alice, "k", &two, second).await.unwrap());
    assert_eq!(
        db::idempotency::find(pool, alice, "k").await.unwrap(),
        Some(Record { execution: second, request_sha256: two }),
        "replaced, and live again"
    );
    test.drop_database().await;
}

/// Two transactions insert an execution and claim one key; the second waits for the first.
async fn race(commit_first: bool) {
    let test = TestDb::new().await;
    let pool = test.pool.clone();
    let action = core_echo(&pool).await;
    let alice = token(&pool, "alice").await;
    let hash = vec![7u8; 32];

    let mut first = pool.begin().await.unwrap();
    let first_execution = db::execution::insert(&mut *first, &attune_testkit::echo_execution(&action)).await.unwrap();
    assert!(db::idempotency::claim(&mut *first, alice, "k", &hash, first_execution.id).await.unwrap());

    let second = tokio::spawn({
        let (pool, action, hash) = (pool.clone(), action.clone(), hash.clone());
        async move {
            let mut second = pool.begin().await.unwrap();
            let execution =
                db::execution::insert(&mut *second, &attune_testkit::echo_execution(&action)).await.unwrap();
            let claimed = db::idempotency::claim(&mut *second, alice, "k", &hash, execution.id).await.unwrap();
            if claimed {
                second.commit().await.unwrap();
            }
            claimed.then_some(execution.id)
        }
    });
    attune_testkit::wait_for(
        "the second claim to wait on the first transaction's key",
        Duration::from_secs(10),
        || {
            let pool = pool.clone();
            async move {
                let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
                (waiting == 1).then_some(())
            }
        },
    )
    .await;
    assert!(!second.is_finished());
    if commit_first {
        first.commit().await.unwrap();
    } else {
        first.rollback().await.unwrap();
    }
    let second = second.await.unwrap();

    let executions: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM execution ORDER BY id").fetch_all(&pool).await.unwrap();
    let recorded = db::idempotency::find(&pool, alice, "k").await.unwrap().unwrap().execution;
    if commit_first {
        assert_eq!(second, None, "the key was taken when the wait ended");
        assert_eq!((executions, recorded), (vec![first_execution.id], first_execution.id));
    } else {
        let second = second.expect("the key was free when the wait ended");
        assert_eq!((executions, recorded), (vec![second], second));
    }
    test.drop_database().await;
}

#[tokio::test]
async fn a_claim_racing_an_uncommitted_one_waits_and_loses_when_it_commits() {
    race(true).await;
}

#[tokio::test]
async fn a_claim_racing_an_uncommitted_one_waits_and_wins_when_it_rolls_back() {
    race(false).await;
}

#[tokio::test]
async fn the_cleanup_deletes_expired_records_oldest_first_a_batch_at_a_time() {
    let test = TestDb::new().await;
    let pool = &test.pool;
    let action = core_echo(pool).await;
    let alice = token(pool, "alice").await;
    let ages = [("live", HOUR), ("old", 25 * HOUR), ("older", 26 * HOUR), ("oldest", 27 * HOUR)];
    for (key, age) in ages {
        let execution = execution(pool, &action).await;
        assert!(db::idempotency::claim(pool, alice, key, &[0u8; 32], execution).await.unwrap());
        backdate(pool, key, age).await;
    }
    let keys = || async {
        let keys: Vec<String> =
            sqlx::query_scalar("SELECT key FROM api_idempotency_key ORDER BY key").fetch_all(pool).await.unwrap();
        keys
    };
    assert_eq!(db::idempotency::delete_expired(pool, 2).await.unwrap(), 2);
    assert_eq!(keys().await, ["live", "old"]);
    assert_eq!(db::idempotency::delete_expired(pool, db::idempotency::CLEANUP_BATCH).await.unwrap(), 1);
    assert_eq!(db::idempotency::delete_expired(pool, db::idempotency::CLEANUP_BATCH).await.unwrap(), 0);
    assert_eq!(keys().await, ["live"]);
    test.drop_database().await;
}
