//! The real binaries, started as a system for one test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::hosts::{Placement, TestHost};
use crate::tcpcut::with_authority;
use crate::{Namespace, TestDb, amqp_url, wait_for};

pub struct SystemBuilder {
    workers: Vec<(String, BTreeMap<String, String>)>,
    hosts: BTreeMap<String, Placement>,
    env: BTreeMap<String, String>,
    packs: Vec<PathBuf>,
    admin_url: Option<String>,
}

impl SystemBuilder {
    /// Adds a worker with extra environment (e.g. `ATTUNE_WORKER_RUNTIMES`).
    pub fn worker(mut self, name: &str, env: &[(&str, &str)]) -> Self {
        self.workers.push((name.to_string(), env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()));
        self
    }
    /// Adds a worker that runs on a test host of its own (`crate::hosts`): in its network
    /// namespace, reaching PostgreSQL and RabbitMQ over its own link.
    pub fn worker_on(mut self, host: &TestHost, name: &str, env: &[(&str, &str)]) -> Self {
        self.hosts.insert(name.to_string(), host.placement());
        self.worker(name, env)
    }
    /// Environment for every process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.insert(key.to_string(), value.to_string());
        self
    }
    /// Lets the workers' http actions reach 127.0.0.1, where a test's `HttpServer` listens
    /// (`ATTUNE_WORKER_HTTP_ALLOW`): without it they refuse loopback, as by default.
    pub fn allow_http_to_loopback(self) -> Self {
        self.env("ATTUNE_WORKER_HTTP_ALLOW", "127.0.0.1/32")
    }
    /// The API and the workers share a secrets key (`ATTUNE_SECRETS_KEY_FILE`), a file of random
    /// bytes made for this system.
    pub fn secrets_key(self) -> Self {
        let path = std::env::temp_dir().join(format!("attune-secrets-key-{:016x}", rand::random::<u64>()));
        let key: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
        std::fs::write(&path, key).unwrap();
        self.env("ATTUNE_SECRETS_KEY_FILE", path.to_str().unwrap())
    }
    /// Workers run process actions as the product does by default when root: each as a user id
    /// of its own (`ATTUNE_WORKER_ACTION_UIDS` unset).
    pub fn actions_as_their_own_users(self) -> Self {
        self.env("ATTUNE_WORKER_ACTION_UIDS", "")
    }
    /// Makes the system's database through `admin_url` rather than the tests' usual admin (e.g. a
    /// standby pair's multi-host URL): the services are given that database on that server.
    pub fn database(mut self, admin_url: &str) -> Self {
        self.admin_url = Some(admin_url.to_string());
        self
    }
    /// A pack to register once the API is up (`packs/core` is always registered).
    pub fn pack(mut self, path: impl Into<PathBuf>) -> Self {
        self.packs.push(path.into());
        self
    }

    pub async fn start(self) -> System {
        let db = match &self.admin_url {
            Some(admin_url) => TestDb::new_on(admin_url).await,
            None => TestDb::new().await,
        };
        let namespace = Namespace::new();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let logs = repo_root().join("target/test-logs").join(&namespace.name);
        std::fs::create_dir_all(&logs).unwrap();
        let mut system = System {
            api_url: format!("http://127.0.0.1:{port}"),
            token: String::new(),
            http: reqwest::Client::new(),
            processes: Processes::default(),
            env: self.env.clone(),
            hosts: self.hosts.clone(),
            cleanup: Cleanup {
                armed: true,
                admin_url: db.admin_url.clone(),
                database: db.name.clone(),
                namespace: namespace.name.clone(),
                logs: logs.clone(),
            },
            logs,
            db,
            namespace,
        };
        system.env.insert("DATABASE_URL".into(), system.db.url.clone());
        // (a test may give the services another broker: a cluster's nodes)
        system.env.entry("AMQP_URL".into()).or_insert_with(amqp_url);
        system.env.insert("ATTUNE_MQ_NAMESPACE".into(), system.namespace.name.clone());
        system.env.insert("ATTUNE_API_ADDR".into(), format!("127.0.0.1:{port}"));
        // the tests run as root, and their actions write pidfiles and marks into directories of
        // root's: actions run as the worker's user unless a test asks for the product's default
        // (`actions_as_their_own_users`)
        system.env.entry("ATTUNE_WORKER_ACTION_UIDS".into()).or_insert_with(|| "off".into());
        // packs are registered only from ATTUNE_PACKS_DIR: each system has its own, holding a
        // copy of packs/core and of every pack the test gave
        let packs_dir = system.packs_dir();
        crate::copy_dir(&repo_root().join("packs/core"), &packs_dir.join("core"));
        let mut packs = vec![packs_dir.join("core")];
        for (n, pack) in self.packs.iter().enumerate() {
            let name = pack.file_name().map_or_else(|| format!("pack-{n}"), |n| n.to_string_lossy().into_owned());
            crate::copy_dir(pack, &packs_dir.join(&name));
            packs.push(packs_dir.join(name));
        }
        system.env.insert("ATTUNE_PACKS_DIR".into(), packs_dir.display().to_string());
        system.env.entry("ATTUNE_HEARTBEAT_INTERVAL_SECS".into()).or_insert_with(|| "1".into());
        // tests force worker health and act on it at once: the scheduler reads the fleet fresh
        system.env.entry("ATTUNE_WORKER_CACHE_MS".into()).or_insert_with(|| "0".into());
        system
            .env
            .entry("RUST_LOG".into())
            .or_insert_with(|| "info,attune_common=debug,attune_executor=debug,attune_worker=debug".into());
        system.spawn("api", "attune-api", &BTreeMap::new());
        system.spawn("executor", "attune-executor", &BTreeMap::new());
        for (name, env) in &self.workers {
            let mut env = env.clone();
            // (an empty ATTUNE_WORKER_NAME given here leaves the worker its default name)
            env.entry("ATTUNE_WORKER_NAME".into()).or_insert_with(|| name.clone());
            env.entry("ATTUNE_WORKER_HEALTH_OVERRIDE_FILE".into())
                .or_insert_with(|| system.health_override_file(name).display().to_string());
            system.spawn(name, "attune-worker", &env);
        }
        system.token = attune_common::db::token::create(&system.db.pool, "test").await.unwrap();
        system.wait_ready().await;
        let expected = self.workers.len() as i64;
        let pool = system.db.pool.clone();
        wait_for("the workers to register and consume", Duration::from_secs(60), || {
            let pool = pool.clone();
            async move {
                let count: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM worker WHERE status = 'active' AND capabilities->>'consuming' = 'true'",
                )
                .fetch_one(&pool)
                .await
                .ok()?;
                (count >= expected).then_some(())
            }
        })
        .await;
        for pack in packs {
            let (status, body) = system.post("/api/v1/packs", &json!({"path": pack})).await;
            assert_eq!(status, 201, "registering {}: {body}", pack.display());
        }
        system
    }
}

/// A running system: the API, one executor and the configured workers, each a real process.
pub struct System {
    pub api_url: String,
    pub token: String,
    pub http: reqwest::Client,
    pub db: TestDb,
    pub namespace: Namespace,
    processes: Processes,
    env: BTreeMap<String, String>,
    /// The processes that run on a test host of their own, by name.
    hosts: BTreeMap<String, Placement>,
    logs: PathBuf,
    cleanup: Cleanup,
}

/// Removes the database and the broker namespace if the test ended without `stop()` (a failed
/// assertion): the processes' logs stay in `target/test-logs/<namespace>/` for reading.
struct Cleanup {
    armed: bool,
    admin_url: String,
    database: String,
    namespace: String,
    logs: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (database, namespace, admin_url) = (self.database.clone(), self.namespace.clone(), self.admin_url.clone());
        eprintln!("test system left logs in {}", self.logs.display());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                if let Ok(admin) = crate::admin_pool(&admin_url).await {
                    let queues: Vec<String> =
                        match crate::admin_pool(&crate::replace_database(&admin_url, &database)).await {
                            Ok(pool) => {
                                let queues = sqlx::query_scalar(
                                    "SELECT capabilities->>'queue' FROM worker WHERE capabilities ? 'queue'",
                                )
                                .fetch_all(&pool)
                                .await
                                .unwrap_or_default();
                                pool.close().await;
                                queues
                            }
                            Err(_) => Vec::new(),
                        };
                    Namespace { name: namespace }.delete(&queues).await;
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
                    )))
                    .execute(&admin)
                    .await;
                }
            });
        })
        .join();
    }
}

/// The child processes, killed when dropped (also when a test panics).
#[derive(Default)]
struct Processes(BTreeMap<String, Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.0.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The directory holding the workspace's binaries (next to the running test's `deps/`).
fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The path of one of the workspace's binaries (`attune`, `attune-api`, `attune-bench`, ...),
/// built by `cargo build --workspace --bins` (`make test` does); panics, saying so, if missing.
pub fn workspace_binary(binary: &str) -> PathBuf {
    let path = binaries_dir().join(binary);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first (`cargo build --workspace --bins`; `make test` does)",
        path.display()
    );
    path
}

impl System {
    pub fn builder() -> SystemBuilder {
        SystemBuilder {
            workers: Vec::new(),
            hosts: BTreeMap::new(),
            env: BTreeMap::new(),
            packs: Vec::new(),
            admin_url: None,
        }
    }

    /// Starts `binary` as `name`. A service logs into the database as its own test login
    /// (`crate::SERVICE_LOGINS`), with the least rights its group role grants, unless the test
    /// gave it a `DATABASE_URL` with another login.
    fn spawn(&mut self, name: &str, binary: &str, extra_env: &BTreeMap<String, String>) {
        let path = workspace_binary(binary);
        let log = std::fs::File::create(self.logs.join(format!("{name}.log"))).unwrap();
        let mut env = extra_env.clone();
        let login = match binary {
            "attune-api" => Some("attune_test_api"),
            "attune-executor" => Some("attune_test_executor"),
            "attune-worker" => Some("attune_test_worker"),
            _ => None,
        };
        if let Some(login) = login {
            let url = env.get("DATABASE_URL").or_else(|| self.env.get("DATABASE_URL")).cloned();
            // a test that names another login keeps it
            if let Some(url) = url.filter(|url| crate::login_of(url) == crate::login_of(&self.db.url)) {
                env.insert("DATABASE_URL".into(), crate::as_login(&url, login));
            }
        }
        // a process on a test host runs in its namespace and reaches the services over its link
        let mut command = match self.hosts.get(name) {
            Some(host) => {
                let database = env.get("DATABASE_URL").or_else(|| self.env.get("DATABASE_URL")).cloned();
                if let Some(url) = database {
                    env.insert("DATABASE_URL".into(), with_authority(&url, &host.database));
                }
                if let Some(url) = env.get("AMQP_URL").or_else(|| self.env.get("AMQP_URL")).cloned() {
                    assert!(!url.contains(','), "a test host reaches one broker node, not a cluster: {url}");
                    env.insert("AMQP_URL".into(), with_authority(&url, &host.broker));
                }
                let mut command = Command::new("ip");
                command.args(["netns", "exec", &host.netns]).arg(&path);
                command
            }
            None => Command::new(&path),
        };
        let child = command
            .envs(&self.env)
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
        self.processes.0.insert(name.to_string(), child);
    }

    /// A command for one of the workspace's binaries with this system's environment (database,
    /// broker, namespace), for a process the test starts and watches itself.
    pub fn command(&self, binary: &str) -> Command {
        let mut command = Command::new(workspace_binary(binary));
        command.envs(&self.env);
        command
    }

    /// This system's `ATTUNE_PACKS_DIR` (a test writes a pack here to register it).
    pub fn packs_dir(&self) -> PathBuf {
        self.logs.join("packs")
    }

    /// Runs the `attune` CLI against this system (its API, token and database) and returns its
    /// stdout; panics unless it succeeds.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args);
        assert!(out.status.success(), "attune {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("the CLI writes UTF-8")
    }

    /// Runs the `attune` CLI against this system, succeeding or not.
    pub fn cli_output(&self, args: &[&str]) -> std::process::Output {
        Command::new(workspace_binary("attune"))
            .args(args)
            .env("ATTUNE_API_URL", &self.api_url)
            .env("ATTUNE_TOKEN", &self.token)
            .env("DATABASE_URL", &self.db.url)
            .output()
            .expect("run attune")
    }

    fn health_override_file(&self, worker: &str) -> PathBuf {
        self.logs.join(format!("{worker}.health.json"))
    }

    /// Makes `worker` report these health fields from its next heartbeat on (`None`: its own).
    pub fn force_health(&self, worker: &str, fields: Option<Value>) {
        let path = self.health_override_file(worker);
        match fields {
            Some(fields) => std::fs::write(path, fields.to_string()).unwrap(),
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Waits until the API shows `worker` with health class `class`.
    pub async fn wait_worker_health(&self, worker: &str, class: &str) -> Value {
        wait_for(&format!("worker {worker} to be {class}"), Duration::from_secs(30), || async move {
            let (_, workers) = self.get("/api/v1/workers").await;
            workers.as_array()?.iter().find(|w| w["name"] == worker && w["health"] == class).cloned()
        })
        .await
    }

    /// Waits until the API shows `worker` reporting every field of `fields` in its health.
    pub async fn wait_worker_reports(&self, worker: &str, fields: &Value) -> Value {
        wait_for(&format!("worker {worker} to report {fields}"), Duration::from_secs(30), || async move {
            let (_, workers) = self.get("/api/v1/workers").await;
            let found = workers.as_array()?.iter().find(|w| w["name"] == worker)?.clone();
            let health = &found["capabilities"]["health"];
            fields.as_object()?.iter().all(|(k, v)| &health[k] == v).then_some(found)
        })
        .await
    }

    /// Executions on worker `worker_id` in any of `statuses` (every status when empty).
    pub async fn count_on(&self, worker_id: i64, statuses: &[&str]) -> i64 {
        let statuses: Vec<String> = statuses.iter().map(|s| s.to_string()).collect();
        sqlx::query_scalar(
            "SELECT count(*) FROM execution WHERE worker = $1 \
             AND (cardinality($2::text[]) = 0 OR status::text = ANY($2))",
        )
        .bind(worker_id)
        .bind(&statuses)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// Waits until the count of executions on `worker_id` in `statuses` satisfies `done`.
    pub async fn wait_count_on(&self, what: &str, worker_id: i64, statuses: &[&str], done: impl Fn(i64) -> bool) {
        wait_for(what, Duration::from_secs(60), || async {
            done(self.count_on(worker_id, statuses).await).then_some(())
        })
        .await
    }

    /// Waits until the API answers `/readyz` with a success (after a start or `restart_with`).
    pub async fn wait_ready(&self) {
        let http = self.http.clone();
        let ready = format!("{}/readyz", self.api_url);
        wait_for("the API to be ready", Duration::from_secs(60), || {
            let (http, ready) = (http.clone(), ready.clone());
            async move { http.get(&ready).send().await.ok().filter(|r| r.status().is_success()).map(|_| ()) }
        })
        .await;
    }

    /// Waits until the worker called `name` is active, consuming, and heartbeating (its last
    /// heartbeat within 2 s): it takes work.
    pub async fn wait_consuming(&self, name: &str) {
        let pool = self.db.pool.clone();
        wait_for(&format!("worker {name} to be active and consuming"), Duration::from_secs(120), || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, bool>(
                    "SELECT true FROM worker WHERE name = $1 AND status = 'active' \
                     AND capabilities->>'consuming' = 'true' AND last_heartbeat > now() - interval '2 seconds'",
                )
                .bind(name)
                .fetch_optional(&pool)
                .await
                .ok()
                .flatten()
            }
        })
        .await;
    }

    /// The id of the worker called `name`.
    pub async fn worker_id(&self, name: &str) -> i64 {
        sqlx::query_scalar("SELECT id FROM worker WHERE name = $1").bind(name).fetch_one(&self.db.pool).await.unwrap()
    }

    /// Sends `signal` (e.g. `libc::SIGKILL` = 9) to a process and, for a fatal one, waits for it.
    pub fn signal(&mut self, name: &str, signal: i32) {
        let child = self.processes.0.get_mut(name).unwrap_or_else(|| panic!("no process {name}"));
        let status = Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill -{signal} {name}");
        if signal == 9 || signal == 15 {
            let _ = child.wait();
        }
    }

    /// The process id of `name` (a service this system started).
    pub fn pid(&self, name: &str) -> u32 {
        self.processes.0.get(name).unwrap_or_else(|| panic!("no process {name}")).id()
    }

    /// Whether `name` still runs (it has not exited since it was started).
    pub fn is_running(&mut self, name: &str) -> bool {
        let child = self.processes.0.get_mut(name).unwrap_or_else(|| panic!("no process {name}"));
        child.try_wait().expect("the process's status").is_none()
    }

    /// Starts one more executor, named `name` (it must start with `executor`: `restart` and
    /// `signal` take it by that name).
    pub fn spawn_executor(&mut self, name: &str) {
        assert!(name.starts_with("executor") && !self.processes.0.contains_key(name), "{name}");
        self.spawn(name, "attune-executor", &BTreeMap::new());
    }

    /// Starts a process again (after `signal`), with the same binary and environment.
    pub fn restart(&mut self, name: &str) {
        self.restart_with(name, &[]);
    }

    /// Starts a process again with extra environment.
    pub fn restart_with(&mut self, name: &str, extra: &[(&str, &str)]) {
        let (binary, env) = match name {
            "api" => ("attune-api", BTreeMap::new()),
            executor if executor.starts_with("executor") => ("attune-executor", BTreeMap::new()),
            worker => {
                let mut env = BTreeMap::new();
                env.insert("ATTUNE_WORKER_NAME".to_string(), worker.to_string());
                env.insert(
                    "ATTUNE_WORKER_HEALTH_OVERRIDE_FILE".to_string(),
                    self.health_override_file(worker).display().to_string(),
                );
                ("attune-worker", env)
            }
        };
        if let Some(mut old) = self.processes.0.remove(name) {
            let _ = old.kill();
            let _ = old.wait();
        }
        let mut env = env;
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self.spawn(name, binary, &env);
    }

    /// Publishes a raw message into this system's namespace (to test duplicates and poison).
    pub async fn publish_raw(&self, routing_key: &str, body: &[u8]) {
        self.publish_on("", routing_key, body).await
    }

    /// Publishes a raw message on the exchange `<namespace><exchange>` (`""`: the main one;
    /// `".control"`: cancel notices), waiting for the broker's confirm.
    pub async fn publish_on(&self, exchange: &str, routing_key: &str, body: &[u8]) {
        self.publish_with(exchange, routing_key, body, lapin::BasicProperties::default()).await
    }

    /// Publishes a raw message as a dead letter that died in `queue` for `reason` (`expired`,
    /// `delivery_limit`, ...): on `<namespace>.dlx` with the `x-death` header the broker writes,
    /// as anyone with `write` on that exchange can (`docs/security-broker.md`).
    pub async fn publish_dead_letter(&self, routing_key: &str, body: &[u8], reason: &str, queue: &str) {
        use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
        let mut death = FieldTable::default();
        death.insert("reason".into(), AMQPValue::LongString(LongString::from(reason)));
        death.insert("queue".into(), AMQPValue::LongString(LongString::from(queue)));
        let mut headers = FieldTable::default();
        headers.insert("x-death".into(), AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])));
        self.publish_with(".dlx", routing_key, body, lapin::BasicProperties::default().with_headers(headers)).await
    }

    /// `publish_on` with these properties (persistent whatever they say).
    pub async fn publish_with(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: lapin::BasicProperties,
    ) {
        use lapin::options::BasicPublishOptions;
        let connection = attune_common::mq::connect(&amqp_url(), "attune-test-publisher").await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(Default::default()).await.unwrap();
        let exchange = format!("{}{exchange}", self.namespace.name);
        let confirm = channel
            .basic_publish(
                exchange.as_str().into(),
                routing_key.into(),
                BasicPublishOptions { mandatory: true, ..Default::default() },
                body,
                properties.with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(matches!(confirm, lapin::Confirmation::Ack(None)), "{confirm:?}");
        let _ = connection.close(200, "done".into()).await;
    }

    /// Waits until a process's log contains `needle`.
    pub async fn wait_log(&self, name: &str, needle: &str) {
        wait_for(&format!("'{needle}' in the {name} log"), Duration::from_secs(30), || async move {
            self.log(name).contains(needle).then_some(())
        })
        .await
    }

    /// Waits until the retry chain of `id` ends in a terminal attempt and returns its attempts.
    pub async fn wait_chain(&self, id: i64, deadline: Duration) -> Vec<Value> {
        wait_for(&format!("the retry chain of {id} to end"), deadline, || async move {
            let (status, chain) = self.get(&format!("/api/v1/executions/{id}/chain")).await;
            assert_eq!(status, 200, "{chain}");
            let attempts = chain["attempts"].as_array()?.clone();
            let last = attempts.last()?;
            let terminal =
                matches!(last["status"].as_str(), Some("completed" | "failed" | "timeout" | "canceled" | "abandoned"));
            // a failed last attempt may still be about to get its retry: only accept it once the
            // API shows it has none
            if !terminal {
                return None;
            }
            let (_, view) = self.get(&format!("/api/v1/executions/{}", last["id"])).await;
            view["retried_by"].is_null().then_some(attempts)
        })
        .await
    }

    /// Runs the command line (`attune ARGS`) against this system's API with its token.
    pub fn attune(&self, args: &[&str]) -> std::process::Output {
        Command::new(workspace_binary("attune"))
            .args(args)
            .env("ATTUNE_API_URL", &self.api_url)
            .env("ATTUNE_TOKEN", &self.token)
            .output()
            .unwrap()
    }

    /// The log file of a process (for assertions and for reading after a failure).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default()
    }

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.api_url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.expect("API request");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.request(reqwest::Method::GET, path, None, Some(&self.token)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.request(reqwest::Method::POST, path, Some(body), Some(&self.token)).await
    }

    /// Submits an execution and returns its JSON (panics unless 201).
    pub async fn submit(&self, action_ref: &str, parameters: Value) -> Value {
        let (status, body) =
            self.post("/api/v1/executions", &json!({"action_ref": action_ref, "parameters": parameters})).await;
        assert_eq!(status, 201, "submit {action_ref}: {body}");
        body
    }

    /// Waits until execution `id` is terminal and returns it.
    pub async fn wait_terminal(&self, id: i64, deadline: Duration) -> Value {
        wait_for(&format!("execution {id} to finish"), deadline, || async move {
            let (status, body) = self.get(&format!("/api/v1/executions/{id}")).await;
            assert_eq!(status, 200, "{body}");
            matches!(body["status"].as_str(), Some("completed" | "failed" | "timeout" | "canceled" | "abandoned"))
                .then_some(body)
        })
        .await
    }

    /// Stops every process and removes the database and the broker namespace.
    pub async fn stop(self) {
        let System { db, namespace, processes, logs, mut cleanup, .. } = self;
        cleanup.armed = false;
        drop(processes);
        let queues: Vec<String> =
            sqlx::query_scalar("SELECT capabilities->>'queue' FROM worker WHERE capabilities ? 'queue'")
                .fetch_all(&db.pool)
                .await
                .unwrap_or_default();
        namespace.delete(&queues).await;
        let _ = std::fs::remove_dir_all(&logs);
        db.drop_database().await;
    }
}
