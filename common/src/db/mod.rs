//! PostgreSQL repositories. Every SQL statement of the services lives under this module, always
//! with bound parameters.

pub mod action;
pub mod announcements;
pub mod audit;
pub mod bench;
pub mod circuit;
pub mod events;
pub mod execution;
pub mod failover;
pub mod fence;
pub mod history;
pub mod idempotency;
pub mod leader;
pub mod pack;
pub mod pause;
pub mod report;
pub mod schedule;
pub mod secret;
pub mod stats;
pub mod token;
pub mod worker;
pub mod workflow;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Connects (retrying with backoff until `deadline` passes, so that a service started alongside
/// its database waits for it) and returns a pool. TLS follows the URL's `sslmode` and
/// `sslrootcert` ([`connect_options`], `crate::tls`); a URL that does not parse, a refused
/// certificate or an unreadable `sslrootcert` is not waited out but returned at once, saying
/// what to check. A URL of several hosts (libpq's form, `host1:5432,host2:5432`) or with
/// `target_session_attrs` gives a pool that follows the host that takes writes ([`failover`]).
pub async fn connect(database_url: &str, max_connections: u32, deadline: Duration) -> Result<PgPool, sqlx::Error> {
    connect_checking(database_url, max_connections, deadline, Check::EveryUse).await
}

/// How a pool makes sure a connection still works before it hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A round trip before every use (sqlx's default): a connection the server closed is never
    /// handed out, so a statement fails only if the server goes while it runs. For callers that
    /// cannot tell whether a failed write landed (the API's inserts).
    EveryUse,
    /// A round trip only after `CHECK_IF_IDLE_FOR` idle. A connection in steady use that the
    /// server closed fails its next statement with an I/O error, which the caller must wait out
    /// and whose write it must be able to read back (the workers' and executors' writes go
    /// through `retry_while_unavailable` and `db::execution::Patience::Surely`). Under load this halves the
    /// round trips of every statement.
    AfterIdle,
}

/// `connect` with the given check of connections before use.
pub async fn connect_checking(
    database_url: &str,
    max_connections: u32,
    deadline: Duration,
    check: Check,
) -> Result<PgPool, sqlx::Error> {
    crate::tls::install_default_provider();
    let hosts = database_hosts(database_url)?;
    let started = std::time::Instant::now();
    let mut delay = Duration::from_millis(100);
    loop {
        let attempt = match hosts.followed() {
            false => pool_options(max_connections, check, None).connect_with(hosts.first().clone()).await,
            true => failover::open(&hosts, |follower| pool_options(max_connections, check, Some(follower))).await,
        };
        let attempt = attempt.map_err(|e| tls_refusal(database_url, e));
        match attempt {
            Ok(pool) => {
                warm(&pool, max_connections.min(WARM_CONNECTIONS)).await;
                return Ok(pool);
            }
            Err(e @ sqlx::Error::Tls(_)) => return Err(e),
            Err(e) if started.elapsed() < deadline => {
                tracing::warn!(error = %e, "database not reachable yet, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A pool's options: `check` before handing a connection out and, for a pool that follows the
/// hosts, the follower's check of every new connection and the closing of those opened before
/// the pool last moved (no round trip: their age tells).
fn pool_options(max_connections: u32, check: Check, follower: Option<Arc<failover::Follower>>) -> PgPoolOptions {
    let options = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(check == Check::EveryUse);
    let Some(follower) = follower else {
        return options.before_acquire(move |connection, meta| {
            Box::pin(async move {
                if check == Check::AfterIdle && meta.idle_for >= CHECK_IF_IDLE_FOR {
                    sqlx::Connection::ping(connection).await?;
                }
                Ok(true)
            })
        });
    };
    let admitting = follower.clone();
    options
        .after_connect(move |connection, _| {
            let follower = admitting.clone();
            Box::pin(async move { follower.admit(connection).await })
        })
        .before_acquire(move |connection, meta| {
            let follower = follower.clone();
            Box::pin(async move {
                if follower.predates_move(meta.age) {
                    return Ok(false);
                }
                if check == Check::AfterIdle && meta.idle_for >= CHECK_IF_IDLE_FOR {
                    sqlx::Connection::ping(connection).await?;
                }
                Ok(true)
            })
        })
}

/// `database_url` as connect options. TLS is used when the URL's `sslmode` (or `PGSSLMODE`) asks
/// for it, and only then: libpq's default, `prefer`, is not followed. It would encrypt without
/// checking who answers, fail (where libpq falls back to plain text) against a server whose TLS
/// rustls does not speak, and cost ~90 ms per connection (sqlx does not set `TCP_NODELAY`, so its
/// handshake waits twice on a delayed ACK). Of a URL of several hosts, the first host's
/// ([`database_hosts`] has them all).
pub fn connect_options(database_url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    Ok(database_hosts(database_url)?.first().clone())
}

/// `database_url`'s hosts (one, or several in libpq's multi-host form), each as connect options
/// made as [`connect_options`] says, and the `target_session_attrs` it names.
pub fn database_hosts(database_url: &str) -> Result<failover::Hosts, sqlx::Error> {
    let query = database_url.split_once('?').map_or("", |(_, query)| query);
    let in_url = query.split('&').any(|pair| pair.starts_with("sslmode=") || pair.starts_with("ssl-mode="));
    let in_environment = std::env::var("PGSSLMODE").is_ok_and(|mode| !mode.trim().is_empty());
    let limits = session_limits(&crate::settings::Environment)?;
    failover::Hosts::parse(database_url, |url| {
        let options: PgConnectOptions = url.parse()?;
        let options = options.options(limits.clone());
        Ok(if in_url || in_environment { options } else { options.ssl_mode(PgSslMode::Disable) })
    })
}

/// The limits every attune session starts with (`ATTUNE_DB_*_TIMEOUT_SECS`,
/// `ATTUNE_DB_IDLE_IN_TRANSACTION_SECS`): no statement runs, waits for a lock or holds a
/// transaction open without end, so one stalled session cannot hold up the others. As server
/// settings (`statement_timeout` and so on, in milliseconds; 0 is off).
pub fn session_limits(source: &dyn crate::settings::Source) -> Result<Vec<(&'static str, String)>, sqlx::Error> {
    let millis = |name: &str| -> Result<String, sqlx::Error> {
        let secs: f64 = crate::settings::read(source, name).map_err(|e| sqlx::Error::Configuration(e.into()))?;
        if !secs.is_finite() || secs < 0.0 {
            let reason = format!("invalid value {secs} for {name}: seconds, 0 or more");
            return Err(sqlx::Error::Configuration(reason.into()));
        }
        Ok(format!("{}", (secs * 1000.0).round() as u64))
    };
    Ok(vec![
        ("statement_timeout", millis("ATTUNE_DB_STATEMENT_TIMEOUT_SECS")?),
        ("lock_timeout", millis("ATTUNE_DB_LOCK_TIMEOUT_SECS")?),
        ("idle_in_transaction_session_timeout", millis("ATTUNE_DB_IDLE_IN_TRANSACTION_SECS")?),
        // a client gone without a reset (a host cut off, a NAT that forgot the connection) is
        // found by the server within about 30 s, and its session ended with its locks, rather
        // than after the kernel's two hours of keepalive or fifteen minutes of retransmissions
        ("tcp_keepalives_idle", "10".into()),
        ("tcp_keepalives_interval", "5".into()),
        ("tcp_keepalives_count", "3".into()),
        ("tcp_user_timeout", "30000".into()),
    ])
}

/// `error` as a `sqlx::Error::Tls` that says what to check when it is a TLS refusal — the server's
/// certificate refused, `sslrootcert` unreadable, TLS required of a server without it — and
/// `error` itself otherwise. (sqlx reports a refused certificate as an I/O error.)
fn tls_refusal(database_url: &str, error: sqlx::Error) -> sqlx::Error {
    let sqlx::Error::Io(io) = &error else {
        return error;
    };
    match crate::tls::tls_error(&error) {
        Some(refused @ rustls::Error::InvalidCertificate(_)) => {
            return sqlx::Error::Tls(
                format!(
                    "the database's certificate was refused ({refused}): with sslmode=verify-ca or verify-full \
                     the CA that signed it must be in DATABASE_URL's sslrootcert (a PEM file) or the system's \
                     roots, and with verify-full it must name the URL's host"
                )
                .into(),
            );
        }
        Some(failed) => {
            return sqlx::Error::Tls(format!("the TLS handshake with the database failed: {failed}").into());
        }
        None => {}
    }
    let names_a_root = ["sslrootcert=", "ssl-root-cert=", "ssl-ca="].iter().any(|key| database_url.contains(key));
    if io.kind() == std::io::ErrorKind::NotFound && names_a_root {
        return sqlx::Error::Tls(format!("cannot read DATABASE_URL's sslrootcert file: {io}").into());
    }
    error
}

/// With `Check::AfterIdle`, a pooled connection idle this long is checked with a round trip before
/// it is handed out (a database restarted meanwhile would fail its first statement); one in
/// steady use is not.
const CHECK_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// Connections a pool opens at start (the rest on demand, as load asks for them).
const WARM_CONNECTIONS: u32 = 2;

/// Opens a few of the pool's connections now, at once, rather than under the first load: a
/// service that reports ready should not make its first requests wait for logins (a
/// `scram-sha-256` login is a few milliseconds of CPU on each side). Not all of them: every
/// process opening its whole pool at start would crowd the server's `max_connections` and its
/// CPU. A connection that cannot be opened now is opened later, on demand.
async fn warm(pool: &PgPool, connections: u32) {
    let opening = futures_util::future::join_all((0..connections).map(|_| pool.acquire()));
    let _ = tokio::time::timeout(Duration::from_secs(5), opening).await;
}

/// Whether an error means the database is unreachable or the statement lost a race (so the same
/// work will succeed if tried again later), as opposed to a problem with the data itself.
pub fn is_transient(error: &sqlx::Error) -> bool {
    if is_connection_lost(error) {
        return true;
    }
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        // too many connections, serialization failure and deadlock; lock_not_available: a lock
        // held past `ATTUNE_DB_LOCK_TIMEOUT_SECS` (by a stalled session, which the server ends
        // after `ATTUNE_DB_IDLE_IN_TRANSACTION_SECS`); read_only_sql_transaction: a write sent to
        // a server that became read-only (a primary being demoted in a switchover) before the
        // pool moved to the one that takes writes (`failover`): refused, so nothing committed
        sqlx::Error::Database(e) => {
            matches!(e.code().unwrap_or_default().as_ref(), "53300" | "40001" | "40P01" | "55P03" | "25006")
        }
        _ => false,
    }
}

/// How long past the session's statement timeout a re-sendable write waits for its answer before
/// it takes the connection for half-open: the round trip and the commit.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(5);

/// The statement timeout taken when the sessions have none (`ATTUNE_DB_STATEMENT_TIMEOUT_SECS=0`):
/// its default.
const UNLIMITED_STATEMENT_BOUND: Duration = Duration::from_secs(60);

/// How long one attempt of a write that is safe to send again (`db::execution::Patience::Surely`)
/// may go unanswered on its connection: the statement timeout its pool's sessions start with
/// (`ATTUNE_DB_STATEMENT_TIMEOUT_SECS`, after which the server itself answers, with an error), or
/// 60 s when they have none, plus [`ANSWER_MARGIN`]: 65 s by default. A connection silent for
/// longer is half-open (its host cut off, a NAT that forgot it: no reset, no data), which the
/// kernel would wait out for about fifteen minutes of retransmissions.
pub fn answer_deadline(db: &PgPool) -> Duration {
    let options = db.connect_options();
    let statement_timeout = statement_timeout_in(options.get_options().unwrap_or_default())
        .filter(|timeout| !timeout.is_zero())
        .unwrap_or(UNLIMITED_STATEMENT_BOUND);
    statement_timeout + ANSWER_MARGIN
}

/// The `statement_timeout` a session's startup options set (`-c statement_timeout=30s`): the
/// last one, as PostgreSQL takes it, in its units (none: milliseconds; `us`, `ms`, `s`, `min`,
/// `h`, `d`); `None` when none is set, or one PostgreSQL would refuse.
fn statement_timeout_in(options: &str) -> Option<Duration> {
    let value = options.split_whitespace().rev().find_map(|option| option.strip_prefix("statement_timeout="))?;
    let value = value.trim_matches(|c| c == '\'' || c == '"');
    let digits = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (number, unit) = value.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let millis = match unit.trim() {
        "" | "ms" => number,
        "us" => number / 1000,
        "s" => number.checked_mul(1000)?,
        "min" => number.checked_mul(60_000)?,
        "h" => number.checked_mul(3_600_000)?,
        "d" => number.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(millis))
}

/// A connection of a pool lent to one attempt of a write (`answered_within`): it goes back to
/// the pool when the attempt hands it back with its answer, and is closed if the attempt is
/// dropped unanswered.
pub struct Lent(Option<sqlx::pool::PoolConnection<sqlx::Postgres>>);

impl std::ops::Deref for Lent {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &sqlx::PgConnection {
        self.0.as_ref().expect("a lent connection is there until dropped")
    }
}

impl std::ops::DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        self.0.as_mut().expect("a lent connection is there until dropped")
    }
}

impl Drop for Lent {
    /// Unanswered: detached from the pool and closed without a goodbye. On a half-open
    /// connection a Terminate would wait as long as the statement did, and a connection given
    /// back would hang the pool's check of it (sqlx pings what comes back), holding a place of
    /// the pool meanwhile.
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            drop(connection.detach());
        }
    }
}

/// Runs `work` on a connection of `db` (lent to it, which it hands back with its answer) and
/// waits at most `deadline` for that answer. A connection that has not answered by then is
/// abandoned, closed rather than given back to the pool (`Lent`), and the answer is an I/O error
/// (`is_connection_lost`: the write may have landed). Taking the connection is bounded by the
/// pool's acquire timeout, whose check of an idle connection drops a silent one the same way.
pub async fn answered_within<T, Fut>(
    db: &PgPool,
    deadline: Duration,
    work: impl FnOnce(Lent) -> Fut,
) -> Result<T, sqlx::Error>
where
    Fut: std::future::Future<Output = (Lent, Result<T, sqlx::Error>)>,
{
    let lent = Lent(Some(db.acquire().await?));
    match tokio::time::timeout(deadline, work(lent)).await {
        Ok((mut lent, answer)) => {
            // (answered: back to the pool)
            drop(lent.0.take());
            answer
        }
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} ms: the connection was abandoned", deadline.as_millis()),
        ))),
    }
}

/// Puts back the statement and lock limits a connection started with (after work that is long
/// by nature lifted them).
pub async fn restore_limits(connection: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("RESET statement_timeout").execute(&mut *connection).await?;
    sqlx::query("RESET lock_timeout").execute(&mut *connection).await.map(|_| ())
}

/// Whether `error` is the connection's loss (I/O, a protocol error, a connection exception, or
/// the server going away, crashing or not yet taking connections): a write sent before it may have committed with its answer lost. A
/// transient error of another kind (a lock or serialization timeout) committed nothing.
pub fn is_connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(e) => {
            let code = e.code().unwrap_or_default();
            code.starts_with("08") || code.starts_with("57P")
        }
        _ => false,
    }
}

/// Runs `work` until it succeeds or fails for a reason other than the database being away,
/// waiting with backoff (100 ms doubling to 5 s) in between. Message handlers use it so that an
/// outage delays messages instead of burning their delivery limit.
pub async fn retry_while_unavailable<T, E, F, Fut>(what: &str, mut work: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display + AsTransient,
{
    let mut delay = Duration::from_millis(100);
    loop {
        match work().await {
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "{what}: dependency unavailable, waiting");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

/// Errors that can say whether they are worth retrying as they are.
pub trait AsTransient {
    fn is_transient(&self) -> bool;
}

impl AsTransient for sqlx::Error {
    fn is_transient(&self) -> bool {
        is_transient(self)
    }
}

/// Takes the session-level advisory lock `key` on this connection if it is free (a singleton
/// across processes); `false` when another session holds it.
pub async fn try_advisory_lock(connection: &mut sqlx::PgConnection, key: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(connection).await
}

/// Releases the advisory lock `key` taken on this connection.
pub async fn advisory_unlock(connection: &mut sqlx::PgConnection, key: i64) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(key).execute(connection).await.map(|_| ())
}

/// Whether the database answers.
pub async fn ping(db: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(db).await.map(|_| ())
}

/// A read-only transaction whose reads all see one snapshot of the record (REPEATABLE READ): an
/// answer made of several statements shows what one moment held, never half of a transaction
/// that committed between them. Dropped, it rolls back.
pub async fn snapshot(db: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    db.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await
}

/// The database's clock (every timestamp in the record is the database's).
pub async fn now(db: impl sqlx::PgExecutor<'_>) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(db).await
}

/// The schema is older than this binary: migrations it needs are not applied.
#[derive(Debug, thiserror::Error)]
#[error(
    "the database schema is behind this binary: {} migration(s) not applied, the first {first}; run `attune migrate` (as the role that owns the schema) before starting the services",
    .pending
)]
pub struct SchemaBehind {
    pub pending: usize,
    pub first: String,
}

/// The versions of the migrations applied here, oldest first (none where none ran).
pub async fn applied_migrations(db: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    match sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version").fetch_all(db).await
    {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => Ok(Vec::new()),
        applied => applied,
    }
}

/// Checks that every migration of this binary is applied (the services do not migrate: that is
/// `attune migrate`'s, as the role that owns the schema). Reads `_sqlx_migrations` only.
pub async fn check_schema(db: &PgPool) -> Result<(), crate::ServiceError> {
    let applied = applied_migrations(db).await?;
    let pending: Vec<_> = MIGRATOR.iter().filter(|m| !applied.contains(&m.version)).collect();
    match pending.first() {
        None => Ok(()),
        Some(first) => Err(SchemaBehind {
            pending: pending.len(),
            first: format!("{}_{}", first.version, first.description.replace(' ', "_")),
        }
        .into()),
    }
}

/// Applies pending migrations (`attune migrate`, `attune up`, the tests). Safe to call from
/// several processes at once (sqlx takes an advisory lock).
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    // On a connection of its own without the statement and lock limits: an index built over a
    // long history may take minutes, and waiting for the table's lock is what a migration must do.
    let options = (*pool.connect_options()).clone().options([("statement_timeout", "0"), ("lock_timeout", "0")]);
    let unlimited = PgPoolOptions::new().max_connections(1).connect_with(options).await?;
    let migrated = MIGRATOR.run(&unlimited).await;
    unlimited.close().await;
    migrated
}

#[cfg(test)]
mod statement_timeout_tests {
    use super::statement_timeout_in;
    use std::time::Duration;

    #[test]
    fn the_statement_timeout_is_the_last_one_set_in_its_units() {
        assert_eq!(statement_timeout_in("-c statement_timeout=30000"), Some(Duration::from_secs(30)));
        assert_eq!(statement_timeout_in("-c statement_timeout=5s -c lock_timeout=1s"), Some(Duration::from_secs(5)));
        assert_eq!(
            statement_timeout_in("-c statement_timeout=1000 -c statement_timeout=2min"),
            Some(Duration::from_secs(120)),
            "the last one, as PostgreSQL takes it"
        );
        assert_eq!(statement_timeout_in("-c statement_timeout=250ms"), Some(Duration::from_millis(250)));
        assert_eq!(statement_timeout_in("-c lock_timeout=1s"), None);
        assert_eq!(statement_timeout_in("-c statement_timeout=soon"), None);
    }
}
