//! What the API's in-process tests share: the router served on port 0 in the test's runtime,
//! against a database and a broker namespace of the test's own, with no executor or worker.
// (each test file uses its own part of this module)
#![allow(dead_code)]

use attune_common::config::{CommonSettings, Defaults, FromEnv};
use attune_testkit::{Namespace, TestDb};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// One API process's worth of state, served in this test's runtime.
pub struct Served {
    pub url: String,
    pub state: attune_api::State,
    pub db: TestDb,
    pub namespace: Namespace,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
}

/// The settings a test API starts with: the documented defaults, against the test's database,
/// broker namespace and the repository's packs, on port 0.
fn settings(db: &TestDb, namespace: &Namespace) -> attune_api::Settings {
    let mut settings = attune_api::Settings::from_source(&Defaults).unwrap();
    settings.common = CommonSettings {
        database_url: db.url.clone(),
        amqp_url: attune_testkit::amqp_url(),
        mq_namespace: namespace.name.clone(),
        packs_dir: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs"),
        default_timeout_secs: 300,
    };
    settings.addr = ([127, 0, 0, 1], 0).into();
    settings
}

impl Served {
    /// Serves an API whose settings `adjust` changes first.
    pub async fn start(adjust: impl FnOnce(&mut attune_api::Settings)) -> Served {
        let db = TestDb::new().await;
        let namespace = Namespace::new();
        let mut settings = settings(&db, &namespace);
        adjust(&mut settings);
        let state = attune_api::state(settings).await.expect("api state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(attune_api::serve(listener, state.clone(), shutdown.clone()));
        Served { url, state, db, namespace, http: reqwest::Client::new(), shutdown }
    }

    /// `method path`, with `body` as JSON if given, as the bearer of the token `secret`.
    pub async fn call_as(
        &self,
        secret: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method.clone(), format!("{}{path}", self.url)).bearer_auth(secret);
        if let Some(body) = &body {
            request = request.json(body);
        }
        answer(request.send().await.unwrap_or_else(|e| panic!("{method} {path}: {e}"))).await
    }

    /// Stops serving and removes the namespace and the database.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.namespace.delete(&[]).await;
        self.db.drop_database().await;
    }
}

/// A response's status and its body as JSON (a body that is not JSON as `{"text": ...}`).
pub async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| json!({ "text": text })))
}

/// Hears `expected` announcements of new `core.echo` (shell) requests, and then none but a
/// marker's: a request inserted here, whose announcement must come next, since announcements
/// come in commit order.
pub async fn announced(
    announcements: &mut attune_common::db::announcements::Announcements,
    pool: &sqlx::PgPool,
    expected: usize,
) {
    use attune_common::db::{self, announcements::Announced};
    let mut next = async || {
        let heard = tokio::time::timeout(std::time::Duration::from_secs(10), announcements.next()).await;
        heard.unwrap_or_else(|_| panic!("fewer than {expected} announcements")).unwrap()
    };
    for _ in 0..expected {
        assert_eq!(next().await, Announced::Runtimes(vec!["shell".into()]));
    }
    let action = db::action::get_by_ref(pool, "core.echo").await.unwrap().unwrap();
    let marker =
        db::execution::NewExecution { runtime: Some("marker".into()), ..attune_testkit::echo_execution(&action) };
    db::execution::insert(pool, &marker).await.unwrap();
    assert_eq!(next().await, Announced::Runtimes(vec!["marker".into()]), "more than {expected} announcements");
}
