//! The API's own cases, in process: the router served on port 0 against a database and a broker
//! namespace of the test's own, with no executor or worker. A failure here names the request and
//! the response, in seconds, where a system test would time out.

use std::time::Duration;

use attune_common::config::{CommonSettings, FromEnv};
use attune_common::db;
use attune_core::health::HealthProbeConfig;
use attune_testkit::{Namespace, TestDb};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// One API process's worth of state, served in this test's runtime.
struct Api {
    url: String,
    token: String,
    http: reqwest::Client,
    db: TestDb,
    namespace: Namespace,
    shutdown: CancellationToken,
}

impl Api {
    async fn start() -> Api {
        let db = TestDb::new().await;
        let namespace = Namespace::new();
        let packs_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs");
        let settings = attune_api::Settings {
            common: CommonSettings {
                database_url: db.url.clone(),
                amqp_url: attune_testkit::amqp_url(),
                mq_namespace: namespace.name.clone(),
                packs_dir,
                default_timeout_secs: 300,
            },
            health: HealthProbeConfig::from_env().unwrap(),
            addr: ([127, 0, 0, 1], 0).into(),
            worker_queue_ttl: Duration::from_secs(300),
            token_cache_ttl: Duration::from_secs(10),
            action_cache_ttl: Duration::from_secs(5),
        };
        let state = attune_api::state(settings).await.expect("api state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(attune_api::serve(listener, state, shutdown.clone()));
        let token = db::token::create(&db.pool, "in-process").await.unwrap();
        Api { url, token, http: reqwest::Client::new(), db, namespace, shutdown }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self.http.request(method.clone(), format!("{}{path}", self.url)).bearer_auth(&self.token);
        if let Some(body) = &body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or_else(|_| json!({ "text": text })))
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn submit(&self, action_ref: &str, parameters: Value) -> i64 {
        let (status, body) =
            self.post("/api/v1/executions", json!({"action_ref": action_ref, "parameters": parameters})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_i64().unwrap()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.namespace.delete(&[]).await;
        self.db.drop_database().await;
    }
}

/// The error body's `code` and `parameter`.
fn error_of(body: &Value) -> (&str, Option<&str>) {
    (body["error"]["code"].as_str().unwrap_or_default(), body["error"]["parameter"].as_str())
}

#[tokio::test]
async fn a_submission_is_a_requested_row_and_bad_ones_name_their_parameter() {
    let api = Api::start().await;
    let id = api.submit("core.echo", json!({"message": "hi"})).await;
    let stored = db::execution::get(&api.db.pool, id).await.unwrap().unwrap();
    assert_eq!(stored.status, attune_core::ExecutionStatus::Requested);
    assert_eq!(stored.runtime.as_deref(), Some("shell"));

    let cases = [
        (json!({"action_ref": "core.nope"}), StatusCode::NOT_FOUND, "action_not_found", None),
        (
            json!({"action_ref": "core.echo", "parameters": {"message": 5}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_parameter",
            Some("parameters.message"),
        ),
        (
            json!({"action_ref": "core.echo", "parameters": []}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_parameter",
            Some("parameters"),
        ),
    ];
    for (body, status, code, parameter) in cases {
        let (got, answer) = api.post("/api/v1/executions", body.clone()).await;
        assert_eq!(got, status, "{body} → {answer}");
        let (got_code, got_parameter) = error_of(&answer);
        assert_eq!(got_code, code, "{body} → {answer}");
        if parameter.is_some() {
            assert_eq!(got_parameter, parameter, "{body} → {answer}");
        }
    }
    api.stop().await;
}

#[tokio::test]
async fn only_health_and_metrics_go_without_a_token() {
    let api = Api::start().await;
    for (path, open) in
        [("/healthz", true), ("/metrics", true), ("/api/v1/executions", false), ("/api/v1/workers", false)]
    {
        let status = api.http.get(format!("{}{path}", api.url)).send().await.unwrap().status();
        if open {
            assert_eq!(status, StatusCode::OK, "{path}");
        } else {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        }
    }
    api.stop().await;
}

#[tokio::test]
async fn manual_retry_follows_the_core_rules_through_both_forms() {
    let api = Api::start().await;
    let running = api.submit("core.echo", json!({"message": "a"})).await;
    let (status, body) = api.post(&format!("/api/v1/executions/{running}/retry"), json!({})).await;
    assert_eq!((status, error_of(&body).0), (StatusCode::CONFLICT, "not_terminal"), "{body}");

    let (status, body) = api.post(&format!("/api/v1/executions/{running}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let canceled = running;

    let example_4 = |action_ref: &str, max_retries: Value| json!({"action_ref": action_ref, "parameters": {"message": "b"}, "config": {"retry_of": canceled, "max_retries": max_retries}});
    let (status, body) = api.post("/api/v1/executions", example_4("core.fail", json!(3))).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_parameter", Some("action_ref"))),
        "{body}"
    );
    let (status, body) = api.post("/api/v1/executions", example_4("core.echo", json!(101))).await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_parameter", Some("config.max_retries"))),
        "{body}"
    );

    let (status, retry) = api.post("/api/v1/executions", example_4("core.echo", json!(3))).await;
    assert_eq!(status, StatusCode::CREATED, "{retry}");
    assert_eq!((retry["original_execution"].as_i64(), retry["max_retries"].as_i64()), (Some(canceled), Some(3)));
    assert_eq!(retry["retry_reason"], "manual_retry");

    let (status, body) = api.post(&format!("/api/v1/executions/{canceled}/retry"), json!({})).await;
    assert_eq!((status, error_of(&body).0), (StatusCode::CONFLICT, "already_retried"), "{body}");
    assert_eq!(body["error"]["retry_execution"], retry["id"], "{body}");

    let (status, body) = api.post("/api/v1/executions/999999/retry", json!({})).await;
    assert_eq!((status, error_of(&body)), (StatusCode::NOT_FOUND, ("execution_not_found", Some("id"))), "{body}");
    api.stop().await;
}
