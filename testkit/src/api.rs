//! One real `attune-api` process (no executor, no worker: nothing runs, rows stay as written)
//! with a database, a broker namespace and a packs directory (the core pack) of its own, for the
//! tests of what the API itself does at its limits.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::system::repo_root;
use crate::{Namespace, TestDb, wait_for, workspace_binary};

pub struct Api {
    pub child: tokio::process::Child,
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// `http://127.0.0.1:<port>` (`https://` when served with TLS).
    pub url: String,
    /// Keeps no idle connection: each would hold one of the server's connections.
    pub http: reqwest::Client,
    /// An admin token.
    pub token: String,
    pub db: TestDb,
    pub namespace: Namespace,
    /// Its packs and its log (`api.log`).
    pub dir: PathBuf,
}

impl Api {
    /// Starts the API with `env` on top of its database, broker and packs; `ca` is the
    /// certificate (PEM) to trust when it serves HTTPS. Returns once `/readyz` answers 200.
    pub async fn start(env: &[(&str, &str)], ca: Option<&Path>) -> Api {
        let db = TestDb::new().await;
        let namespace = Namespace::new();
        let dir = repo_root().join("target/test-logs").join(&namespace.name);
        crate::copy_dir(&repo_root().join("packs/core"), &dir.join("packs/core"));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("api.log")).unwrap();
        let child = tokio::process::Command::new(workspace_binary("attune-api"))
            .kill_on_drop(true)
            .env("DATABASE_URL", db.url_as("attune_test_api"))
            .env("AMQP_URL", crate::amqp_url())
            .env("ATTUNE_MQ_NAMESPACE", &namespace.name)
            .env("ATTUNE_API_ADDR", &addr)
            .env("ATTUNE_PACKS_DIR", dir.join("packs"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start attune-api");
        let http = client(ca);
        let url = format!("{}://{addr}", if ca.is_some() { "https" } else { "http" });
        let token = attune_common::db::token::create(&db.pool, "test").await.unwrap();
        let api = Api { child, addr, url, http, token, db, namespace, dir };
        let ready = format!("{}/readyz", api.url);
        wait_for("the API to be ready", Duration::from_secs(60), || {
            let (http, ready) = (api.http.clone(), ready.clone());
            async move { http.get(&ready).send().await.ok().filter(|r| r.status().is_success()).map(|_| ()) }
        })
        .await;
        api
    }

    pub async fn get(&self, path: &str) -> (u16, Vec<u8>) {
        let response = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (response.status().as_u16(), response.bytes().await.unwrap().to_vec())
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let (status, body) = self.get(path).await;
        (status, serde_json::from_slice(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e})")))
    }

    /// POSTs `body` (with an `Idempotency-Key` when given); returns the status and the JSON
    /// answer (null when it is none).
    pub async fn post(&self, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(60))
            .json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The executions written.
    pub async fn executions(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(&self.db.pool).await.unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("api.log")).unwrap_or_default()
    }

    /// The process's resident memory now and at its peak, in MiB (from `/proc`).
    pub fn memory_mib(&self) -> Option<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()?)).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        };
        Some((field("VmRSS:")? / 1024, field("VmHWM:")? / 1024))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        self.namespace.delete(&[]).await;
        self.db.drop_database().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A reqwest client (rustls with ring), trusting `ca` besides the system's roots when given. It
/// keeps no idle connection.
pub fn client(ca: Option<&Path>) -> reqwest::Client {
    attune_common::tls::install_default_provider();
    let mut builder = reqwest::Client::builder().pool_max_idle_per_host(0);
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).unwrap();
        builder = builder.tls_certs_merge(reqwest::Certificate::from_pem_bundle(&pem).unwrap());
    }
    builder.build().unwrap()
}
