//! No attune session can hold up the others for long (issue 31): every session starts with
//! statement, lock and idle-in-transaction limits, and the singleton work's lock
//! (`db::leader`) goes to another process when its holder stalls.

use std::time::{Duration, Instant};

use attune_common::db::{self, leader::Leadership};
use attune_common::settings::Vars;
use attune_testkit::{TestDb, wait_for};
use sqlx::Connection;

#[tokio::test]
async fn every_session_starts_with_the_documented_limits() {
    let test = TestDb::new().await;
    let shown: (String, String, String) = sqlx::query_as(
        "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), \
         current_setting('idle_in_transaction_session_timeout')",
    )
    .fetch_one(&test.pool)
    .await
    .unwrap();
    assert_eq!(shown, ("1min".to_string(), "5s".to_string(), "30s".to_string()));
    // (issue 46) the server finds a client gone without a reset within about 30 s
    let probes: (String, String, String, String) = sqlx::query_as(
        "SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), \
         current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout')",
    )
    .fetch_one(&test.pool)
    .await
    .unwrap();
    assert_eq!(probes, ("10".to_string(), "5".to_string(), "3".to_string(), "30000".to_string()));
    let off = db::session_limits(&Vars(&[("ATTUNE_DB_STATEMENT_TIMEOUT_SECS", "0")])).unwrap();
    assert_eq!(off[0], ("statement_timeout", "0".to_string()));
    let error = db::session_limits(&Vars(&[("ATTUNE_DB_LOCK_TIMEOUT_SECS", "-1")])).unwrap_err();
    assert!(error.to_string().contains("ATTUNE_DB_LOCK_TIMEOUT_SECS"), "{error}");
    test.drop_database().await;
}

#[tokio::test]
async fn a_session_stalled_inside_a_transaction_loses_its_locks_and_a_waiter_gives_its_connection_back() {
    let test = TestDb::new().await;
    let limits = db::session_limits(&Vars(&[
        ("ATTUNE_DB_IDLE_IN_TRANSACTION_SECS", "1"),
        ("ATTUNE_DB_LOCK_TIMEOUT_SECS", "0.2"),
    ]))
    .unwrap();
    let options = db::connect_options(&test.url).unwrap().options(limits);
    sqlx::query("CREATE TABLE circuit_like (id int PRIMARY KEY, n int)").execute(&test.pool).await.unwrap();
    sqlx::query("INSERT INTO circuit_like VALUES (1, 0)").execute(&test.pool).await.unwrap();

    // a session takes the row's lock and its process stalls
    let mut stalled = sqlx::PgConnection::connect_with(&options).await.unwrap();
    sqlx::query("BEGIN").execute(&mut stalled).await.unwrap();
    sqlx::query("SELECT n FROM circuit_like WHERE id = 1 FOR UPDATE").execute(&mut stalled).await.unwrap();

    // a waiter does not wait without end: it gets its connection back, saying why
    let mut waiter = sqlx::PgConnection::connect_with(&options).await.unwrap();
    let started = Instant::now();
    let error = sqlx::query("UPDATE circuit_like SET n = n + 1 WHERE id = 1").execute(&mut waiter).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert!(db::is_transient(&error), "a lock timeout is tried again: {error}");

    // the server ends the stalled session, and the row is free
    wait_for("the stalled session's lock to go", Duration::from_secs(10), || async {
        sqlx::query("UPDATE circuit_like SET n = n + 1 WHERE id = 1").execute(&test.pool).await.ok().map(|_| ())
    })
    .await;
    assert!(sqlx::query("SELECT 1").execute(&mut stalled).await.is_err(), "the stalled session was ended");
    test.drop_database().await;
}

const KEY: i64 = 0x6174_7475_6e65_00ff;

#[tokio::test]
async fn a_stalled_leader_loses_the_lock_within_its_lease_and_a_working_one_keeps_it() {
    let test = TestDb::new().await;
    let lease = Duration::from_secs(2);

    // a holder that works longer than its lease keeps the lock throughout
    let held = Leadership::try_take(&test.pool, KEY, lease).await.unwrap().expect("free");
    let pool = test.pool.clone();
    let contested = held
        .run(async move {
            let mut tries = 0;
            let started = Instant::now();
            while started.elapsed() < lease * 3 {
                assert!(Leadership::try_take(&pool, KEY, lease).await.unwrap().is_none(), "taken while held");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tries
        })
        .await
        .expect("the session lasted");
    assert!(contested > 10, "{contested}");
    let again = Leadership::try_take(&test.pool, KEY, lease).await.unwrap().expect("released after the work");
    // taken and dropped without its work: the lock goes with the session
    drop(again);

    // one that stalls (holds the lock and does nothing) loses it once its session idles past the lease
    // (the dropped one's session ends when the server reads its connection's close: a moment later)
    let stalled = wait_for("the dropped holder's session to end", Duration::from_secs(5), || async {
        Leadership::try_take(&test.pool, KEY, lease).await.unwrap()
    })
    .await;
    let started = Instant::now();
    let other = wait_for("another process to take the lock", Duration::from_secs(10), || async {
        Leadership::try_take(&test.pool, KEY, lease).await.unwrap()
    })
    .await;
    assert!(started.elapsed() >= lease, "taken before the lease ran out: {:?}", started.elapsed());
    // the stalled holder, back, finds its session gone and does not do the work
    let did = stalled.run(async { "worked" }).await;
    assert!(did.is_err(), "{did:?}");
    other.run(async {}).await.unwrap();
    test.drop_database().await;
}
