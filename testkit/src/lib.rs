//! Test support for attune's integration and end-to-end tests, on the real PostgreSQL and
//! RabbitMQ (never mocks):
//! - [`TestDb`]: a fresh, migrated database per test, dropped at the end.
//! - [`Namespace`]: an MQ namespace of its own per test; its queues and exchanges are deleted
//!   at the end.
//! - [`System`]: the real `attune-api`, `attune-executor` and `attune-worker` binaries started
//!   against both, with an HTTP client and waits on conditions with deadlines (never sleeps).
//! - [`hosts::TestHost`]: a network namespace of this machine, for a worker on a host of its own
//!   that a test can cut off from the broker, the database or both.
//! - [`browser::Browser`]: a headless chromium driven over WebDriver, for the dashboard's tests.
//!
//! Settings: `ATTUNE_TEST_DATABASE_URL` (else `DATABASE_URL`, else the attune default) must be
//! allowed to create databases; `AMQP_URL` as for the services.

pub mod api;
pub mod browser;
pub mod fuse;
pub mod hosts;
pub mod http_server;
pub mod pgcut;
pub mod runs;
pub mod system;
pub mod tcpcut;
pub mod tls;

use std::future::Future;
use std::time::{Duration, Instant};

use attune_common::config::{Environment, read};
use sqlx::PgPool;

pub use system::{System, SystemBuilder, workspace_binary};

pub fn admin_database_url() -> String {
    std::env::var("ATTUNE_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| read(&Environment, "DATABASE_URL").expect("DATABASE_URL"))
}

/// A pool on a tests' admin URL: sqlx's own for a URL of one host, as always; for one of several
/// hosts (a standby pair's, `scripts/test-pg-standby.sh`), one that follows the host that takes
/// writes, as the services' pools do (`attune_common::db::failover`).
pub async fn admin_pool(url: &str) -> Result<PgPool, sqlx::Error> {
    match attune_common::db::database_hosts(url)?.followed() {
        false => PgPool::connect(url).await,
        true => attune_common::db::connect(url, 2, Duration::from_secs(30)).await,
    }
}

pub fn amqp_url() -> String {
    read(&Environment, "AMQP_URL").expect("AMQP_URL")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}_{:x}", std::process::id(), rand::random::<u32>())
}

/// A database of its own for one test, migrated. Call [`TestDb::drop_database`] at the end (a
/// failing test leaves it behind for inspection; names start with `attune_test_`).
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    /// The admin URL it was made with (and is dropped with).
    pub admin_url: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        Self::new_on(&admin_database_url()).await
    }

    /// A database of its own, migrated, made through `admin_url` (a login that may create
    /// databases) rather than the tests' usual admin.
    pub async fn new_on(admin_url: &str) -> TestDb {
        let db = Self::empty_on(admin_url).await;
        attune_common::db::migrate(&db.pool).await.expect("migrate test database");
        ensure_service_logins_on(admin_url).await;
        grant_test_worker_runtimes(&db.pool).await;
        db
    }

    /// This database's URL for `login` (one of `SERVICE_LOGINS`).
    pub fn url_as(&self, login: &str) -> String {
        as_login(&self.url, login)
    }

    /// A database of its own with no schema at all (for tests of the migrations themselves).
    pub async fn empty() -> TestDb {
        Self::empty_on(&admin_database_url()).await
    }

    async fn empty_on(admin_url: &str) -> TestDb {
        let admin_url = admin_url.to_string();
        let admin = admin_pool(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {admin_url} to create a test database: {e}"));
        let name = unique("attune_test");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&admin)
            .await
            .expect("create test database");
        admin.close().await;
        let url = replace_database(&admin_url, &name);
        let pool =
            attune_common::db::connect(&url, 8, Duration::from_secs(10)).await.expect("connect to test database");
        TestDb { name, url, pool, admin_url }
    }

    pub async fn drop_database(self) {
        self.pool.close().await;
        let admin = admin_pool(&self.admin_url).await.expect("admin connection");
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name)))
            .execute(&admin)
            .await;
        admin.close().await;
    }
}

/// The logins the tests' services use, one per service (`attune_test_api`, ...), each a member
/// of the group role the migrations make for it (`migrations/20261130000100_service_roles.sql`),
/// with `service_login_password()`. `attune_test_worker_b` is a second worker login, for tests that two
/// workers' logins cannot touch each other's executions.
pub const SERVICE_LOGINS: [(&str, &str); 4] = [
    ("attune_test_api", "attune_api"),
    ("attune_test_executor", "attune_executor"),
    ("attune_test_worker", "attune_worker"),
    ("attune_test_worker_b", "attune_worker"),
];
/// The service logins' password: `ATTUNE_TEST_LOGIN_PASSWORD`, which `scripts/test.sh` exports
/// from `.attune/credentials` (random, made once per checkout) and sets on the logins; else that
/// file's line.
pub fn service_login_password() -> String {
    static PASSWORD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PASSWORD
        .get_or_init(|| {
            if let Ok(password) = std::env::var("ATTUNE_TEST_LOGIN_PASSWORD") {
                return password;
            }
            let file = crate::system::repo_root().join(".attune/credentials");
            std::fs::read_to_string(&file)
                .ok()
                .and_then(|text| {
                    text.lines().find_map(|l| l.strip_prefix("ATTUNE_TEST_LOGIN_PASSWORD=").map(String::from))
                })
                .unwrap_or_else(|| {
                    panic!(
                        "no ATTUNE_TEST_LOGIN_PASSWORD in the environment or in {}: scripts/test.sh makes it and the \
                         test logins (or run `. scripts/lib.sh; ensure_services; ensure_test_logins`)",
                        file.display()
                    )
                })
        })
        .clone()
}

/// Every runtime attune knows, for the tests' worker logins (`worker_login_runtime`): a test of
/// what a login may serve takes some back.
pub const RUNTIMES: [&str; 4] = ["shell", "python", "builtin", "http"];

/// Lets both test worker logins serve every runtime in `pool`'s database.
pub async fn grant_test_worker_runtimes(pool: &PgPool) {
    let runtimes: Vec<String> = RUNTIMES.iter().map(|r| r.to_string()).collect();
    for login in ["attune_test_worker", "attune_test_worker_b"] {
        attune_common::db::worker::allow_runtimes(pool, login, &runtimes)
            .await
            .expect("grant the test worker runtimes");
    }
}

/// Makes the service logins where they are missing, if the tests' admin may (`scripts/test.sh`
/// makes them as the superuser: `ensure_test_logins`); once per test process, several processes
/// taking turns on an advisory lock.
pub async fn ensure_service_logins() {
    ensure_service_logins_on(&admin_database_url()).await
}

/// `ensure_service_logins` on the server of `admin_url` (once per test process and URL).
pub async fn ensure_service_logins_on(admin_url: &str) {
    static DONE: tokio::sync::Mutex<Vec<String>> = tokio::sync::Mutex::const_new(Vec::new());
    let mut done = DONE.lock().await;
    if done.iter().any(|url| url == admin_url) {
        return;
    }
    {
        let admin = admin_pool(admin_url).await.expect("admin connection");
        let mut connection = admin.acquire().await.unwrap();
        sqlx::query("SELECT pg_advisory_lock(7300432)").execute(&mut *connection).await.unwrap();
        for (login, group) in SERVICE_LOGINS {
            let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)")
                .bind(login)
                .fetch_one(&mut *connection)
                .await
                .unwrap();
            if !exists {
                let create =
                    format!("CREATE ROLE {login} LOGIN PASSWORD '{}' IN ROLE {group}", service_login_password());
                sqlx::query(sqlx::AssertSqlSafe(create)).execute(&mut *connection).await.unwrap_or_else(|e| {
                    panic!(
                        "the test login {login} is missing and cannot be made here ({e}): scripts/test.sh makes \
                         the test logins (or run `. scripts/lib.sh; ensure_test_logins`)"
                    )
                });
            }
        }
        sqlx::query("SELECT pg_advisory_unlock(7300432)").execute(&mut *connection).await.unwrap();
        drop(connection);
        admin.close().await;
    }
    done.push(admin_url.to_string());
}

/// The login (user) `url` names.
pub fn login_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or("");
    authority.rsplit_once('@').map_or("", |(userinfo, _)| userinfo.split(':').next().unwrap_or(""))
}

/// `url` logging in as `login` (with the service logins' password).
pub fn as_login(url: &str, login: &str) -> String {
    let scheme_end = url.find("://").map(|i| i + 3).unwrap_or(0);
    let rest = &url[scheme_end..];
    let host_start = rest.find('/').map_or(rest.len(), |slash| rest[..slash].rfind('@').map_or(0, |at| at + 1));
    format!("{}{login}:{}@{}", &url[..scheme_end], service_login_password(), &rest[host_start..])
}

/// `postgres://u:p@h:port/db?x` with `db` replaced.
pub fn replace_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let root = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    format!("{root}/{database}{query}")
}

/// An MQ namespace of its own for one test.
pub struct Namespace {
    pub name: String,
}

impl Namespace {
    pub fn new() -> Namespace {
        Namespace { name: unique("t") }
    }

    /// Deletes the namespace's queues (the shared ones and the given worker queues) and exchanges.
    pub async fn delete(&self, worker_queues: &[String]) {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        let topology = attune_common::mq::Topology::new(&self.name, Duration::from_secs(1));
        let Ok(connection) = attune_common::mq::connect(&amqp_url(), "attune-test-cleanup").await else {
            return;
        };
        let Ok(channel) = connection.create_channel().await else {
            return;
        };
        let mut queues = vec![
            topology.requests_queue(),
            topology.results_queue(),
            topology.dead_letter_queue(),
            topology.parked_queue(),
        ];
        queues.extend(worker_queues.iter().cloned());
        for queue in queues {
            let _ = channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await;
        }
        for exchange in [topology.exchange(), topology.dead_letter_exchange(), topology.control_exchange()] {
            let _ = channel.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default()).await;
        }
        let _ = connection.close(200, "done".into()).await;
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Self::new()
    }
}

/// Polls `check` until it returns `Some`, or panics naming `what` after `deadline`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    let mut delay = Duration::from_millis(10);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < deadline, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

/// A series' value in a Prometheus text page (`series` as written, labels included), 0 when it
/// has no sample yet (a counter is exported once it has counted).
pub fn metric_sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.parse().expect("a sample's value is a number"))
        .unwrap_or(0.0)
}

/// A requested `message: hi` execution of `action` (a `core.echo`), for repository tests.
pub fn echo_execution(action: &attune_common::db::action::Action) -> attune_common::db::execution::NewExecution {
    attune_common::db::execution::NewExecution {
        action: Some(action.id),
        action_ref: action.action_ref.clone(),
        runtime: None,
        parameters: serde_json::json!({"message": "hi"}),
        config: serde_json::json!({}),
        status: attune_core::ExecutionStatus::Requested,
        max_retries: 0,
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

/// Copies a directory tree (a pack a test changes or removes).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Force-closes the broker connections whose client properties contain `name` (attune's
/// processes name their connections: `attune-worker-<name>-consumer`, `...-control-consumer`);
/// returns how many. Needs RabbitMQ's CLI with the rights to use it (root here).
pub fn close_broker_connections(name: &str) -> usize {
    let listing = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl (RabbitMQ's CLI, as root)");
    let mut closed = 0;
    for line in String::from_utf8_lossy(&listing.stdout).lines().filter(|l| l.contains(name)) {
        let pid = line.split_whitespace().next().unwrap();
        let status =
            std::process::Command::new("rabbitmqctl").args(["close_connection", pid, "test"]).status().unwrap();
        assert!(status.success());
        closed += 1;
    }
    closed
}

/// Puts an execution into `status` directly, on `worker` (test set-up only: the product writes
/// states through the guarded transitions).
pub async fn force_status(pool: &sqlx::PgPool, id: i64, status: attune_core::ExecutionStatus, worker: Option<i64>) {
    sqlx::query("UPDATE execution SET status = $2, worker = $3, finished = CASE WHEN $4 THEN now() END WHERE id = $1")
        .bind(id)
        .bind(status)
        .bind(worker)
        .bind(status.is_terminal())
        .execute(pool)
        .await
        .unwrap();
}

/// A process the test started itself, killed and reaped when dropped, however the test ends.
pub struct Started(pub std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pack written for one test in a directory of its own, removed when dropped: `pack.yaml` for
/// `pack_ref`, and each `(name, text)` of `files` under `actions/` (action YAMLs and scripts).
pub struct TempPack(std::path::PathBuf);

impl TempPack {
    pub fn new(pack_ref: &str, files: &[(&str, &str)]) -> TempPack {
        let dir = std::env::temp_dir().join(format!("attune-{pack_ref}-pack-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(dir.join("actions")).unwrap();
        std::fs::write(dir.join("pack.yaml"), format!("ref: {pack_ref}\nversion: 1.0.0\n")).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join("actions").join(name), text).unwrap();
        }
        TempPack(dir)
    }

    /// The pack with `workflows/NAME` holding `text`.
    pub fn workflow(self, name: &str, text: &str) -> TempPack {
        std::fs::create_dir_all(self.0.join("workflows")).unwrap();
        std::fs::write(self.0.join("workflows").join(name), text).unwrap();
        self
    }

    /// The pack with the file `path` (under the pack's directory: `rules/r.yaml`) holding `text`.
    pub fn file(self, path: &str, text: &str) -> TempPack {
        let at = self.0.join(path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, text).unwrap();
        self
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempPack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_replaced() {
        assert_eq!(replace_database("postgres://a:b@h:5432/attune", "x"), "postgres://a:b@h:5432/x");
        assert_eq!(replace_database("postgres://a@h/attune?sslmode=disable", "x"), "postgres://a@h/x?sslmode=disable");
        assert_eq!(replace_database("postgres://h:5432", "x"), "postgres://h:5432/x");
    }
}
