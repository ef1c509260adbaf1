//! Pools of a multi-host `DATABASE_URL` (`db::failover`) on the real PostgreSQL, without a
//! standby: the "hosts" are proxies in front of the one server (`attune_testkit::pgcut`) or a
//! port nobody listens on. A pool whose host stops answering (partitioned, no reset) moves to the
//! next host and its statements succeed there; a host that refuses connections is passed over (a
//! refused certificate is not: it is reported at once); a server whose sessions start read-only is refused for `read-write`, naming what it is, and
//! taken for `primary`. (`tests/tests/pg_switchover.rs` promotes a real standby.)

use std::time::{Duration, Instant};

use attune_common::db::{self, failover};
use attune_common::metrics::{DATABASE_HOST_MOVES, counter_value};
use attune_testkit::pgcut::PgCut;
use attune_testkit::{TestDb, wait_for};

/// `url` with its host replaced by `hosts` (`host:port,host:port`) and `query` added.
fn on_hosts(url: &str, hosts: &str, query: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let credentials = authority.rsplit_once('@').map(|(c, _)| format!("{c}@")).unwrap_or_default();
    let separator = if path.contains('?') { '&' } else { '?' };
    format!("{scheme}://{credentials}{hosts}/{path}{separator}{query}")
}

#[tokio::test]
async fn a_pool_moves_off_a_host_that_stops_answering() {
    let test = TestDb::new().await;
    let (first, second) = (PgCut::start("127.0.0.1:5432").await, PgCut::start("127.0.0.1:5432").await);
    let hosts = format!("127.0.0.1:{},127.0.0.1:{}", first.port, second.port);
    let url = on_hosts(&test.url, &hosts, "sslmode=disable&target_session_attrs=read-write");
    let pool = db::connect_checking(&url, 4, Duration::from_secs(10), db::Check::AfterIdle).await.unwrap();
    db::ping(&pool).await.unwrap();
    let moved_to = format!("127.0.0.1:{}", second.port);
    assert_eq!(counter_value(&DATABASE_HOST_MOVES, &[("host", &moved_to)]), 0);

    first.partition();
    let cut = Instant::now();
    // (each try bounded: a statement on a connection to the partitioned host waits for ever)
    wait_for("the pool to answer on the second host", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move { tokio::time::timeout(Duration::from_millis(500), db::ping(&pool)).await.ok()?.ok() }
    })
    .await;
    let took = cut.elapsed();
    assert_eq!(counter_value(&DATABASE_HOST_MOVES, &[("host", &moved_to)]), 1, "the pool did not move");
    // noticed at the watcher's next check, which waits its patience for an answer
    assert!(took < failover::WATCH_EVERY + failover::PATIENCE + Duration::from_secs(3), "moved after {took:?}");
    // and stays there: every connection it hands out now answers
    for _ in 0..8 {
        tokio::time::timeout(Duration::from_secs(2), db::ping(&pool))
            .await
            .expect("a connection to the lost host")
            .unwrap();
    }
    first.heal();
    pool.close().await;
    test.drop_database().await;
}

#[tokio::test]
async fn a_host_that_refuses_connections_is_passed_over() {
    let test = TestDb::new().await;
    // (nothing listens on port 1)
    let url = on_hosts(&test.url, "127.0.0.1:1,127.0.0.1:5432", "target_session_attrs=any");
    let pool = db::connect(&url, 2, Duration::from_secs(10)).await.unwrap();
    let port: i32 = sqlx::query_scalar("SELECT inet_server_port()").fetch_one(&pool).await.unwrap();
    assert_eq!(port, 5432);
    pool.close().await;
    // none answering: an error that says what each was, without waiting past the deadline
    let url = on_hosts(&test.url, "127.0.0.1:1,127.0.0.1:2", "target_session_attrs=read-write");
    let error = db::connect(&url, 2, Duration::from_millis(200)).await.unwrap_err().to_string();
    assert!(error.contains("no host of DATABASE_URL takes writes") && error.contains("127.0.0.1:2: "), "{error}");
    // a certificate refused (the server's names `localhost`, not the address) is said at once,
    // as with one host, not waited out
    let started = Instant::now();
    let url = on_hosts(&test.url, "127.0.0.1:1,127.0.0.1:5432", "sslmode=verify-full&target_session_attrs=read-write");
    let refused = db::connect(&url, 2, Duration::from_secs(30)).await.unwrap_err();
    assert!(
        matches!(refused, sqlx::Error::Tls(_)) && refused.to_string().contains("certificate was refused"),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "waited out: {:?}", started.elapsed());
    test.drop_database().await;
}

#[tokio::test]
async fn read_only_sessions_are_refused_for_read_write_and_taken_for_primary() {
    let test = TestDb::new().await;
    let make_read_only = format!("ALTER DATABASE \"{}\" SET default_transaction_read_only = on", test.name);
    sqlx::query(sqlx::AssertSqlSafe(make_read_only)).execute(&test.pool).await.unwrap();

    let read_write = on_hosts(&test.url, "127.0.0.1:5432", "target_session_attrs=read-write");
    let error = db::connect(&read_write, 2, Duration::from_millis(200)).await.unwrap_err().to_string();
    assert!(error.contains("127.0.0.1:5432: read-only (default_transaction_read_only)"), "{error}");

    // a connection a pool opens to it later is refused likewise (a pool's `after_connect`)
    let hosts = db::database_hosts(&read_write).unwrap();
    let follower = failover::Follower::new(hosts.clone(), 0);
    let mut connection = sqlx::ConnectOptions::connect(hosts.first()).await.unwrap();
    let refused = follower.admit(&mut connection).await.unwrap_err().to_string();
    assert!(refused.contains("database host 127.0.0.1:5432: it is read-only"), "{refused}");
    assert!(refused.contains("target_session_attrs=read-write"), "{refused}");

    let primary = on_hosts(&test.url, "127.0.0.1:5432", "target_session_attrs=primary");
    let pool = db::connect(&primary, 2, Duration::from_secs(10)).await.unwrap();
    // a write there is refused, and waited out as the database being away rather than failed
    let refused = sqlx::query("CREATE TABLE t (x int)").execute(&pool).await.unwrap_err();
    assert!(db::is_transient(&refused), "{refused}");
    pool.close().await;
    test.drop_database().await;
}
