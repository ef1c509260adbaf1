//! `runtime: http` actions end to end, with the real binaries against a scripted local HTTP
//! server: 5xx is retried as a chain whose every request carries the chain's Idempotency-Key; a
//! 404 fails at once; a 429's Retry-After holds the retry back; parameters reach the server
//! URL-encoded in the URL and JSON-encoded in the body, intact; a cancel aborts the request. And
//! `packs/examples` loads.

use std::path::Path;
use std::time::Duration;

use attune_testkit::http_server::{HttpServer, Reply};
use attune_testkit::system::repo_root;
use attune_testkit::{System, TempPack, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// A pack of http actions aimed at `server`, in a directory of its own (removed when dropped).
struct HttpPack(TempPack);

impl HttpPack {
    fn write(server: &HttpServer) -> HttpPack {
        let port = server.port();
        // `case` picks the server's script (one path segment); retries are fast but for a
        // Retry-After, which must hold them back
        let call = format!(
            "name: call\nruntime: http\ntimeout_seconds: 10\nmax_retries: 3\n\
             retry: {{base_delay_secs: 0.2, jitter: 0}}\n\
             http:\n  url: \"http://127.0.0.1:{port}/{{{{ case }}}}\"\n\
             \x20 headers:\n    X-Api-Key: literal-key-123\n\
             parameters:\n  case:\n    type: string\n    required: true\n"
        );
        let echo_json = format!(
            "name: echo_json\nruntime: http\ntimeout_seconds: 10\nmax_retries: 3\n\
             retry: {{base_delay_secs: 0.2, jitter: 0}}\n\
             http:\n  method: POST\n  url: \"http://127.0.0.1:{port}/echo/{{{{ text }}}}?q={{{{ text }}}}&n={{{{ n }}}}\"\n\
             \x20 headers:\n    X-Text: \"{{{{ text }}}}\"\n\
             \x20 body:\n    text: \"{{{{ text }}}}\"\n    n: \"{{{{ n }}}}\"\n    note: \"got {{{{ text }}}}\"\n\
             parameters:\n  text:\n    type: string\n    required: true\n  n:\n    type: integer\n    default: 7\n"
        );
        let echo_text = format!(
            "name: echo_text\nruntime: http\ntimeout_seconds: 10\nmax_retries: 3\n\
             retry: {{base_delay_secs: 0.2, jitter: 0}}\n\
             http:\n  method: PUT\n  url: \"http://127.0.0.1:{port}/text/{{{{ text }}}}\"\n\
             \x20 body: '{{\"text\": {{{{ text }}}}, \"both\": [{{{{ text }}}}, {{{{ n }}}}]}}'\n\
             parameters:\n  text:\n    type: string\n    required: true\n  n:\n    type: integer\n    default: 7\n"
        );
        HttpPack(TempPack::new(
            "httptest",
            &[("call.yaml", &call), ("echo_json.yaml", &echo_json), ("echo_text.yaml", &echo_text)],
        ))
    }
}

async fn system_with(pack: &HttpPack) -> System {
    System::builder().allow_http_to_loopback().worker("w1", &[]).pack(pack.0.path()).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_as_a_chain_with_one_idempotency_key() {
    let server = HttpServer::start().await;
    let last = Reply::status(200).header("Set-Cookie", "session=abc123").header("X-Auth-Token", "t0k3n");
    server.script("/chain", [Reply::status(503), Reply::status(503), last.json(&json!({"done": true}))]);
    server.script("/single", [Reply::status(200)]);
    let pack = HttpPack::write(&server);
    let system = system_with(&pack).await;
    let first = system.submit("httptest.call", json!({"case": "chain"})).await;
    let other = system.submit("httptest.call", json!({"case": "single"})).await;

    let chain = system.wait_chain(id(&first), DEADLINE).await;
    let seen: Vec<(&str, Option<&str>, Option<i64>)> = chain
        .iter()
        .map(|a| (a["status"].as_str().unwrap(), a["failure_kind"].as_str(), a["http_status"].as_i64()))
        .collect();
    assert_eq!(
        seen,
        [
            ("failed", Some("transient_error"), Some(503)),
            ("failed", Some("transient_error"), Some(503)),
            ("completed", None, Some(200))
        ],
        "{chain:#?}"
    );
    let url = server.url("/chain");
    assert_eq!(chain[0]["error"], format!("HTTP 503 Service Unavailable from GET {url}"));
    assert_eq!(
        chain[2]["result"],
        json!({"status": 200, "headers": chain[2]["result"]["headers"], "body": {"done": true}})
    );
    assert_eq!(chain[2]["result"]["headers"]["content-type"], "application/json");
    // credentials in a response are not stored; one written in the pack is sent, never shown
    let headers = &chain[2]["result"]["headers"];
    assert_eq!((&headers["set-cookie"], &headers["x-auth-token"]), (&json!("[redacted]"), &json!("[redacted]")));
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM execution WHERE result::text LIKE '%abc123%' OR result::text LIKE '%t0k3n%'",
    )
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(stored, 0, "a response's credential was stored");
    let (_, action) = system.get("/api/v1/actions/httptest.call").await;
    assert_eq!(action["http"]["headers"]["X-Api-Key"], "[redacted]", "{action}");
    assert!(server.requests_to("/chain").iter().all(|r| r.header("x-api-key") == Some("literal-key-123")));

    let key = chain[0]["idempotency_key"].as_str().unwrap();
    assert!(chain.iter().all(|a| a["idempotency_key"] == key), "one key per chain: {chain:#?}");
    let requests = server.requests_to("/chain");
    assert_eq!(requests.len(), 3, "one request per attempt");
    for request in &requests {
        assert_eq!(request.header("idempotency-key"), Some(key), "{request:?}");
    }

    let other = system.wait_terminal(id(&other), DEADLINE).await;
    assert_eq!(other["status"], "completed", "{other}");
    let other_key = server.requests_to("/single")[0].header("idempotency-key").unwrap().to_string();
    assert_eq!(other["idempotency_key"], other_key.as_str());
    assert_ne!(other_key, key, "another submission is another chain");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_fails_at_once_without_a_retry() {
    let server = HttpServer::start().await;
    server.script("/missing", [Reply::status(404).body("no such thing")]);
    let pack = HttpPack::write(&server);
    let system = system_with(&pack).await;
    let submitted = system.submit("httptest.call", json!({"case": "missing"})).await;
    let chain = system.wait_chain(id(&submitted), DEADLINE).await;
    assert_eq!(chain.len(), 1, "a 404 is not retried: {chain:#?}");
    let failed = &chain[0];
    assert_eq!((failed["status"].as_str(), failed["failure_kind"].as_str()), (Some("failed"), Some("action_failed")));
    assert_eq!(failed["http_status"], 404);
    assert_eq!(failed["error"], format!("HTTP 404 Not Found from GET {}", server.url("/missing")));
    assert_eq!(failed["result"]["body"], "no such thing", "the response is kept on a failure");
    let retries: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE original_execution = $1")
        .bind(id(failed))
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(retries, 0);
    assert_eq!(server.requests_to("/missing").len(), 1);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_holds_the_retry_back() {
    let server = HttpServer::start().await;
    server.script("/busy", [Reply::status(429).header("Retry-After", "2"), Reply::status(200)]);
    let pack = HttpPack::write(&server);
    let system = system_with(&pack).await;
    let submitted = system.submit("httptest.call", json!({"case": "busy"})).await;
    let chain = system.wait_chain(id(&submitted), DEADLINE).await;
    let statuses: Vec<&str> = chain.iter().map(|a| a["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["failed", "completed"], "{chain:#?}");
    assert_eq!(
        (chain[0]["http_status"].as_i64(), chain[0]["failure_kind"].as_str()),
        (Some(429), Some("transient_error"))
    );
    // the backoff alone would be 0.2 s
    let backoff = chain[1]["backoff_secs"].as_f64().unwrap();
    assert!(backoff >= 2.0, "the retry's not_before is {backoff} s after the failure: {chain:#?}");
    let reason = chain[0]["retry_decision"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("Retry-After"), "the decision says why it waited: {reason}");
    let requests = server.requests_to("/busy");
    assert_eq!(requests.len(), 2);
    let waited = requests[1].received - requests[0].received;
    assert!(waited >= Duration::from_secs(2), "the server heard again after {waited:?}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_reach_the_server_encoded_and_intact() {
    let text = "a b/&?#%\"é";
    let encoded = "a%20b%2F%26%3F%23%25%22%C3%A9";
    let server = HttpServer::start().await;
    server.script(&format!("/echo/{encoded}"), [Reply::status(201).json(&json!({"ok": true}))]);
    server.script(&format!("/text/{encoded}"), [Reply::status(204)]);
    let pack = HttpPack::write(&server);
    let system = system_with(&pack).await;
    let as_json = system.submit("httptest.echo_json", json!({"text": text})).await;
    let as_text = system.submit("httptest.echo_text", json!({"text": text, "n": 3})).await;

    let as_json = system.wait_terminal(id(&as_json), DEADLINE).await;
    assert_eq!(
        (as_json["status"].as_str(), as_json["http_status"].as_i64()),
        (Some("completed"), Some(201)),
        "{as_json}"
    );
    assert_eq!(as_json["result"]["body"], json!({"ok": true}));
    let got = server.requests_to(&format!("/echo/{encoded}"));
    assert_eq!(got.len(), 1, "{:?}", server.requests());
    let request = &got[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.query(), Some(format!("q={encoded}&n=7").as_str()));
    assert_eq!(request.header("x-text"), Some(text));
    assert_eq!(request.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body, json!({"text": text, "n": 7, "note": format!("got {text}")}));

    let as_text = system.wait_terminal(id(&as_text), DEADLINE).await;
    assert_eq!(
        (as_text["status"].as_str(), as_text["http_status"].as_i64()),
        (Some("completed"), Some(204)),
        "{as_text}"
    );
    let got = server.requests_to(&format!("/text/{encoded}"));
    assert_eq!(got.len(), 1, "{:?}", server.requests());
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body, json!({"text": text, "both": [text, 3]}), "a string body JSON-encodes each value");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_aborts_the_request() {
    let server = HttpServer::start().await;
    server.script("/hang", [Reply::status(200).after(Duration::from_secs(60))]);
    let pack = HttpPack::write(&server);
    let system = system_with(&pack).await;
    let submitted = system.submit("httptest.call", json!({"case": "hang"})).await;
    server.wait_requests("/hang", 1, DEADLINE).await;
    let (status, body) = system.post(&format!("/api/v1/executions/{}/cancel", id(&submitted)), &json!({})).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("canceled")), "{body}");
    wait_for("the worker to hang up on the server", Duration::from_secs(10), || async {
        (server.hung_up("/hang") == 1).then_some(())
    })
    .await;
    system.wait_log("w1", "request aborted").await;
    let canceled = system.wait_terminal(id(&submitted), DEADLINE).await;
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(server.requests_to("/hang").len(), 1, "no retry of a canceled execution");
    system.stop().await;
}

#[test]
fn the_example_pack_loads() {
    let pack = attune_common::pack::load_pack(&repo_root().join("packs/examples")).unwrap();
    assert_eq!((pack.manifest.pack_ref.as_str(), pack.manifest.version.as_str()), ("examples", "1.0.0"));
    let by_name = |name: &str| {
        pack.actions.iter().find(|a| a.spec.name == name).unwrap_or_else(|| panic!("examples.{name} is missing"))
    };
    let status = by_name("http_status");
    assert_eq!(status.spec.runtime, "http");
    assert_eq!(status.spec.retry.as_ref().unwrap().rules.as_ref().unwrap().len(), 2);
    let batch = by_name("batch_job");
    assert_eq!(batch.spec.retry.as_ref().unwrap().rules.as_ref().unwrap()[0].when.exit_codes, Some(vec![3]));
    assert_eq!(by_name("sync_files").spec.max_retries_in_force(), 2, "max_attempts: 3");
    assert_eq!(by_name("wait_for_service").spec.max_retries_in_force(), -1);
    // the book's worked workflow
    let remediate = pack.workflows.iter().find(|w| w.workflow_ref == "examples.remediate").expect("examples.remediate");
    let steps: Vec<&str> = remediate.spec.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(steps, ["check", "restart", "verify", "notify"]);
    assert!(by_name("create_order").spec.retry.as_ref().unwrap().circuit.is_some());
    assert!(pack.actions.iter().all(|a| a.warnings.is_empty()), "{:?}", pack.actions);
    assert!(Path::new(&repo_root().join("packs/examples/README.md")).is_file());
}
