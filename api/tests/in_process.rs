//! The API's own cases, in process: the router served on port 0 against a database and a broker
//! namespace of the test's own, with no executor or worker. A failure here names the request and
//! the response, in seconds, where a system test would time out.

use attune_common::db;
use reqwest::StatusCode;
use serde_json::{Value, json};
mod support;

use support::Served;

/// The test's API and a token for it.
struct Api {
    served: Served,
    token: String,
}

impl std::ops::Deref for Api {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

impl Api {
    async fn start() -> Api {
        Self::start_with(|_| {}).await
    }

    /// An API with its settings changed by `adjust` first.
    async fn start_with(adjust: impl FnOnce(&mut attune_api::Settings)) -> Api {
        let served = Served::start(adjust).await;
        let token = db::token::create(&served.db.pool, "in-process").await.unwrap();
        Api { served, token }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call_as(&self.token, method, path, body).await
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
        self.served.stop().await;
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
async fn oversized_parameters_are_refused_with_413_naming_the_parameter_and_nothing_is_stored() {
    let api = Api::start_with(|settings| {
        settings.parameter_limits = attune_core::params::SizeLimits { total_bytes: 60, value_bytes: 50 };
    })
    .await;
    let submit = |parameters: Value| {
        let api = &api;
        async move {
            api.call(
                reqwest::Method::POST,
                "/api/v1/executions",
                Some(json!({"action_ref": "core.python_echo", "parameters": parameters})),
            )
            .await
        }
    };
    let (status, body) = submit(json!({"message": "x".repeat(51)})).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (413, Some("too_large")), "{body}");
    assert_eq!(body["error"]["parameter"], "parameters.message");
    assert!(body["error"]["message"].as_str().unwrap().contains("ATTUNE_API_MAX_PARAMETER_VALUE_BYTES"), "{body}");
    // each value within its limit, the whole (the default `repeat` included) over it
    let (status, body) = submit(json!({"message": "x".repeat(45)})).await;
    assert_eq!(status.as_u16(), 413, "{body}");
    assert_eq!(body["error"]["parameter"], "parameters.message", "the largest is named");
    assert!(body["error"]["message"].as_str().unwrap().contains("ATTUNE_API_MAX_PARAMETERS_BYTES"), "{body}");
    let (status, body) = submit(json!({"message": "x".repeat(30)})).await;
    assert_eq!(status.as_u16(), 201, "{body}");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(&api.db.pool).await.unwrap();
    assert_eq!(stored, 1, "only the submission within the limits was stored");
    // a manual retry's replacement parameters are held to the same limits
    let id = body["id"].as_i64().unwrap();
    sqlx::query("UPDATE execution SET status = 'failed', finished = now() WHERE id = $1")
        .bind(id)
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (status, body) = api
        .call(
            reqwest::Method::POST,
            &format!("/api/v1/executions/{id}/retry"),
            Some(json!({"parameters": {"message": "y".repeat(51)}})),
        )
        .await;
    assert_eq!((status.as_u16(), body["error"]["parameter"].as_str()), (413, Some("parameters.message")), "{body}");
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

#[tokio::test]
async fn every_rejection_is_json_naming_what_was_wrong_and_nul_never_reaches_the_database() {
    let api = Api::start().await;
    // text PostgreSQL cannot store: 422 naming the field, wherever it comes in
    let cases = [
        (json!({"action_ref": "core.e\u{0}cho"}), "action_ref"),
        (json!({"action_ref": "core.echo", "parameters": {"message": "a\u{0}b"}}), "parameters.message"),
        (json!({"action_ref": "core.echo", "config": {"tags": ["x", "y\u{0}"]}}), "config.tags[1]"),
    ];
    for (body, parameter) in cases {
        let (status, answer) = api.post("/api/v1/executions", body.clone()).await;
        assert_eq!(
            (status, error_of(&answer)),
            (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_parameter", Some(parameter))),
            "{body}"
        );
    }
    for path in ["/api/v1/actions/core.e%00cho", "/api/v1/executions?action_ref=a%00b"] {
        let (status, answer) = api.call(reqwest::Method::GET, path, None).await;
        assert_eq!(
            (status, error_of(&answer)),
            (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_parameter", Some("action_ref"))),
            "{path}"
        );
    }

    // the framework's own rejections answer in the error shape too
    let raw = |content_type: &'static str, body: &'static str| {
        api.http
            .post(format!("{}/api/v1/executions", api.url))
            .bearer_auth(&api.token)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    for (content_type, body, status, code) in [
        ("application/json", "{not json", StatusCode::BAD_REQUEST, "bad_request"),
        ("text/plain", "{}", StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
    ] {
        let response = raw(content_type, body).await.unwrap();
        assert_eq!(response.status(), status, "{content_type} {body}");
        let answer: Value = response.json().await.expect("a JSON error body");
        assert_eq!(error_of(&answer).0, code, "{answer}");
    }
    let (status, answer) = api.call(reqwest::Method::PUT, "/api/v1/executions", None).await;
    assert_eq!((status, error_of(&answer).0), (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"), "{answer}");
    let (status, answer) = api.call(reqwest::Method::GET, "/api/v1/executions/not-a-number", None).await;
    assert_eq!((status, error_of(&answer)), (StatusCode::BAD_REQUEST, ("bad_request", Some("id"))), "{answer}");

    // no pack at a path is a 404 naming it; an empty path is a 422
    let (status, answer) = api.post("/api/v1/packs", json!({"path": "/nonexistent/pack"})).await;
    assert_eq!((status, error_of(&answer)), (StatusCode::NOT_FOUND, ("pack_not_found", Some("path"))), "{answer}");
    let (status, answer) = api.post("/api/v1/packs", json!({"path": ""})).await;
    assert_eq!(
        (status, error_of(&answer)),
        (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_parameter", Some("path"))),
        "{answer}"
    );

    // a retry with a `null` body keeps the retried execution's parameters
    let id = api.submit("core.echo", json!({"message": "kept"})).await;
    api.post(&format!("/api/v1/executions/{id}/cancel"), json!({})).await;
    let (status, retry) = api.post(&format!("/api/v1/executions/{id}/retry"), Value::Null).await;
    assert_eq!(status, StatusCode::CREATED, "{retry}");
    assert_eq!(retry["parameters"]["message"], "kept");
    // ... but a body that is not JSON is refused, never taken for "no body"
    let response = api
        .http
        .post(format!("{}/api/v1/executions/{id}/retry", api.url))
        .bearer_auth(&api.token)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("parameters=changed")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // every body is an object: serde alone would take an array for a struct
    for (path, body) in [
        ("/api/v1/executions".to_string(), json!(["core.echo"])),
        (format!("/api/v1/executions/{id}/retry"), json!([])),
        (format!("/api/v1/executions/{id}/fail"), json!(["stuck"])),
        ("/api/v1/packs".to_string(), json!(["/tmp"])),
    ] {
        let (status, answer) = api.post(&path, body.clone()).await;
        assert_eq!(
            (status, error_of(&answer)),
            (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_parameter", Some("body"))),
            "{path} {body}"
        );
    }
    api.stop().await;
}

#[tokio::test]
async fn an_operator_fails_a_stuck_execution_by_hand_and_it_is_never_retried() {
    let api = Api::start().await;
    let id = api.submit("core.echo", json!({"message": "stuck"})).await;
    let (status, failed) =
        api.post(&format!("/api/v1/executions/{id}/fail"), json!({"reason": "stuck since Monday"})).await;
    assert_eq!(status, StatusCode::OK, "{failed}");
    assert_eq!((failed["status"].as_str(), failed["failure_kind"].as_str()), (Some("failed"), Some("operator_failed")));
    assert_eq!(failed["error"], "failed by an operator: stuck since Monday");

    let (status, answer) = api.post(&format!("/api/v1/executions/{id}/fail"), json!({"reason": "again"})).await;
    assert_eq!((status, error_of(&answer).0), (StatusCode::CONFLICT, "already_finished"), "{answer}");
    let (status, answer) = api.post(&format!("/api/v1/executions/{id}/fail"), json!({"reason": ""})).await;
    assert_eq!(
        (status, error_of(&answer)),
        (StatusCode::UNPROCESSABLE_ENTITY, ("invalid_parameter", Some("reason"))),
        "{answer}"
    );
    let (status, answer) = api.post(&format!("/api/v1/executions/{id}/fail"), json!({})).await;
    assert_eq!((status, error_of(&answer).1), (StatusCode::UNPROCESSABLE_ENTITY, Some("reason")), "{answer}");

    // a retry waiting out its backoff is not stuck
    let parent = db::execution::get(&api.db.pool, id).await.unwrap().unwrap();
    let delayed = db::execution::NewExecution::retry_of(
        &parent,
        attune_core::ExecutionStatus::Delayed,
        attune_core::FailureKind::TransientError,
        None,
        Some(chrono::Utc::now() + chrono::Duration::hours(1)),
    );
    let delayed = db::execution::insert(&api.db.pool, &delayed).await.unwrap();
    let (status, answer) = api.post(&format!("/api/v1/executions/{}/fail", delayed.id), json!({"reason": "x"})).await;
    assert_eq!((status, error_of(&answer).0), (StatusCode::CONFLICT, "not_stuck"), "{answer}");
    api.stop().await;
}

#[tokio::test]
async fn the_settings_in_force_are_readable_in_sql_and_through_the_api() {
    let api = Api::start().await;
    let config = attune_core::retry::RetrySettings {
        enabled: false,
        base_backoff_secs: 2.5,
        max_backoff_secs: 60.0,
        backoff_multiplier: 3.0,
        jitter_factor: 0.1,
        circuit: None,
    };
    // what an executor writes at start
    db::worker::store_retry_config(&api.db.pool, &config).await.unwrap();
    let (status, body) = api.call(reqwest::Method::GET, "/api/v1/config", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["retry"]["enabled"], &body["retry"]["base_backoff_secs"], &body["retry"]["jitter_factor"]),
        (&json!(false), &json!(2.5), &json!(0.1)),
        "{body}"
    );
    assert_eq!(body["health"]["degraded_threshold"], 3, "{body}");
    let enabled: bool = sqlx::query_scalar("SELECT enabled FROM retry_config").fetch_one(&api.db.pool).await.unwrap();
    assert!(!enabled, "the quick reference's check reads it in SQL");
    api.stop().await;
}

/// Writes a pack with `pack_ref` and one action into `dir`.
fn write_pack(dir: &std::path::Path, pack_ref: &str, action: &str) {
    std::fs::create_dir_all(dir.join("actions")).unwrap();
    std::fs::write(dir.join("pack.yaml"), format!("ref: {pack_ref}\nversion: 1.0.0\n")).unwrap();
    std::fs::write(dir.join("actions/a.sh"), "echo hi\n").unwrap();
    std::fs::write(dir.join("actions/a.yaml"), action).unwrap();
}

#[tokio::test]
async fn packs_are_registered_only_from_the_packs_dir_and_a_ref_is_not_taken_over_unasked() {
    let root = std::env::temp_dir().join(format!("attune-packs-dir-{}", api_unique()));
    let packs = root.join("packs");
    let outside = root.join("outside");
    let action = "name: a\nruntime: shell\nentrypoint: actions/a.sh\n";
    write_pack(&packs.join("mine"), "mine", action);
    write_pack(&packs.join("mine2"), "mine", action);
    write_pack(&outside.join("evil"), "evil", action);
    std::os::unix::fs::symlink(outside.join("evil"), packs.join("link")).unwrap();
    // a pack inside whose pack.yaml, or whose entrypoint, is a link to a file outside
    write_pack(&packs.join("sneaky"), "sneaky", action);
    std::fs::remove_file(packs.join("sneaky/pack.yaml")).unwrap();
    std::os::unix::fs::symlink(outside.join("evil/pack.yaml"), packs.join("sneaky/pack.yaml")).unwrap();
    write_pack(&packs.join("sneaky2"), "sneaky2", action);
    std::fs::remove_file(packs.join("sneaky2/actions/a.sh")).unwrap();
    std::os::unix::fs::symlink(outside.join("evil/actions/a.sh"), packs.join("sneaky2/actions/a.sh")).unwrap();
    // a type error must not echo the file
    write_pack(
        &packs.join("typo"),
        "typo",
        "name: a\nruntime: shell\nentrypoint: actions/a.sh\nmax_retries: hunter2-secret\n",
    );
    let dir = packs.clone();
    let api = Api::start_with(move |settings| settings.common.packs_dir = dir).await;
    let path = |p: &std::path::Path| json!({"path": p});

    // registered at start: the one pack that is what it says; nothing else
    let (_, listed) = api.call(reqwest::Method::GET, "/api/v1/packs", None).await;
    let refs: Vec<&str> = listed.as_array().unwrap().iter().map(|p| p["ref"].as_str().unwrap()).collect();
    assert_eq!(refs, ["mine"], "{listed}");

    for outside_path in [outside.join("evil"), packs.join("link"), packs.join("mine/../../outside/evil")] {
        let (status, answer) = api.post("/api/v1/packs", path(&outside_path)).await;
        assert_eq!(
            (status, error_of(&answer)),
            (StatusCode::FORBIDDEN, ("outside_packs_dir", Some("path"))),
            "{}: {answer}",
            outside_path.display()
        );
    }
    for (sneaky, file) in [("sneaky", "pack.yaml"), ("sneaky2", "a.yaml")] {
        let (status, answer) = api.post("/api/v1/packs", json!({"path": sneaky})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(file) && message.contains("outside"), "{message}");
    }
    let (status, answer) = api.post("/api/v1/packs", json!({"path": "typo"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(!answer.to_string().contains("hunter2"), "the file's content is not echoed: {answer}");
    assert!(answer.to_string().contains("max_retries"), "{answer}");

    // the same ref from another directory: refused, then taken over with force
    let (status, answer) = api.post("/api/v1/packs", json!({"path": "mine2"})).await;
    assert_eq!((status, error_of(&answer)), (StatusCode::CONFLICT, ("pack_exists", Some("path"))), "{answer}");
    let registered_from: String =
        sqlx::query_scalar("SELECT path FROM pack WHERE ref = 'mine'").fetch_one(&api.db.pool).await.unwrap();
    assert!(registered_from.ends_with("/packs/mine"), "unchanged: {registered_from}");
    let (status, answer) = api.post("/api/v1/packs", json!({"path": "mine2", "force": true})).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert!(answer["path"].as_str().unwrap().ends_with("/packs/mine2"), "{answer}");
    // and the same directory again is an update, not a takeover
    let (status, answer) = api.post("/api/v1/packs", json!({"path": packs.join("mine2")})).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    api.stop().await;
    let _ = std::fs::remove_dir_all(&root);
}

/// A name no other test run uses at the same time.
fn api_unique() -> String {
    format!(
        "{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_share_inserts_and_announcements_and_each_gets_its_own_row() {
    let api = std::sync::Arc::new(Api::start().await);
    let mut announcements = db::announcements::Announcements::listen(&api.db.url).await.unwrap();
    let submissions = (0..40).map(|n| {
        let api = api.clone();
        tokio::spawn(async move { (n, api.submit("core.echo", json!({"message": format!("m{n}")})).await) })
    });
    let mut ids = Vec::new();
    for submitted in futures_util::future::join_all(submissions).await {
        let (n, id) = submitted.unwrap();
        let message: String =
            sqlx::query_scalar("SELECT parameters->>'message' FROM execution WHERE id = $1 AND status = 'requested'")
                .bind(id)
                .fetch_one(&api.db.pool)
                .await
                .unwrap();
        assert_eq!(message, format!("m{n}"), "each submitter is answered with its own row");
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40);
    // nothing else writes these rows here (no executor): each one's xmin is its insert's transaction
    let inserts: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM execution").fetch_one(&api.db.pool).await.unwrap();
    assert!(inserts < 40, "submissions that came while an insert was in flight share the next: {inserts} inserts");
    // each insert announced its runtime once, at its commit (before its submitters were
    // answered), and nothing else did
    support::announced(&mut announcements, &api.db.pool, inserts as usize).await;
    // and nothing went through the broker for them
    let queue = api.state.publisher.topology().requests_queue();
    assert_eq!(api.state.publisher.queue_length(&queue).await.unwrap(), 0, "no request hints");
    let api = std::sync::Arc::into_inner(api).unwrap();
    api.stop().await;
}

/// A chain read while the RetryManager records a failure and its retry in one transaction sees
/// both or neither: never the failed attempt without the retry it already has. (The dashboard
/// stops following a chain whose attempts are all finished, so such an answer left a delayed
/// retry off the page for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_read_while_a_retry_is_recorded_sees_the_failure_and_its_retry_together() {
    use attune_core::{ExecutionStatus, FailureKind};
    let api = Api::start().await;
    let first = api.submit("core.echo", json!({"message": "hi"})).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (http, url, token, done) = (api.http.clone(), api.url.clone(), api.token.clone(), done.clone());
        tokio::spawn(async move {
            let mut torn = Vec::new();
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let response = http
                    .get(format!("{url}/api/v1/executions/{first}/chain?fields=summary"))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .unwrap();
                let (status, chain) = support::answer(response).await;
                assert_eq!(status, StatusCode::OK, "{chain}");
                reads += 1;
                let attempts = chain["attempts"].as_array().unwrap();
                // every failure here has its retry, recorded with it
                if chain["truncated"] == false && attempts.last().unwrap()["status"] == "failed" {
                    torn.push(format!("chain of {}", chain["total"]));
                }
                // and an execution's view: failed exactly when it has its retry
                let last = attempts.last().unwrap()["id"].as_i64().unwrap();
                let response =
                    http.get(format!("{url}/api/v1/executions/{last}")).bearer_auth(&token).send().await.unwrap();
                let (_, view) = support::answer(response).await;
                if (view["status"] == "failed") != view["retried_by"].is_i64() {
                    torn.push(format!("#{last} {} retried by {}", view["status"], view["retried_by"]));
                }
            }
            (reads, torn)
        })
    };
    let mut last = db::execution::get(&api.db.pool, first).await.unwrap().unwrap();
    for _ in 0..300 {
        let mut tx = api.db.pool.begin().await.unwrap();
        let failed = db::execution::transition(
            &mut *tx,
            last.id,
            &db::execution::Transition::to(ExecutionStatus::Failed).from(&[ExecutionStatus::Requested]),
        )
        .await
        .unwrap()
        .expect("the last attempt fails");
        let retry = db::execution::NewExecution::retry_of(
            &failed,
            ExecutionStatus::Requested,
            FailureKind::Timeout,
            None,
            None,
        );
        last = db::execution::insert(&mut *tx, &retry).await.unwrap();
        tx.commit().await.unwrap();
        tokio::task::yield_now().await;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (reads, torn) = reader.await.unwrap();
    assert!(reads > 20, "the chain was read {reads} times while retries were recorded");
    assert!(torn.is_empty(), "{} of {reads} chain reads were torn: {torn:?}", torn.len());
    api.stop().await;
}
