//! The OpenAPI document at `/api/v1/openapi.json` against what the API serves and what the
//! book's Using it chapter documents: a route missing from any of them fails here.

use std::collections::BTreeSet;

use attune_testkit::System;
use attune_testkit::system::repo_root;
use serde_json::Value;

/// Every route of the API, as the book's route table (book/src/using-it.md) and DESIGN.md name them.
const ROUTES: [(&str, &str); 56] = [
    ("post", "/api/v1/executions"),
    ("get", "/api/v1/executions"),
    ("get", "/api/v1/executions/{id}"),
    ("post", "/api/v1/executions/{id}/retry"),
    ("post", "/api/v1/executions/{id}/cancel"),
    ("post", "/api/v1/executions/{id}/fail"),
    ("get", "/api/v1/executions/{id}/chain"),
    ("get", "/api/v1/executions/{id}/output"),
    ("post", "/api/v1/executions/bulk"),
    ("get", "/api/v1/workflows/{id}"),
    ("get", "/api/v1/actions"),
    ("get", "/api/v1/actions/{action_ref}"),
    ("put", "/api/v1/actions/{action_ref}/concurrency"),
    ("delete", "/api/v1/actions/{action_ref}/concurrency"),
    ("get", "/api/v1/packs"),
    ("post", "/api/v1/packs"),
    ("get", "/api/v1/workers"),
    ("put", "/api/v1/workers/{name}/drain"),
    ("delete", "/api/v1/workers/{name}/drain"),
    ("get", "/api/v1/config"),
    ("get", "/api/v1/stats/retries"),
    ("get", "/api/v1/stats/retries/series"),
    ("get", "/api/v1/stats/workers"),
    ("get", "/api/v1/whoami"),
    ("get", "/api/v1/tokens"),
    ("post", "/api/v1/tokens"),
    ("delete", "/api/v1/tokens/{id}"),
    ("get", "/api/v1/secrets"),
    ("put", "/api/v1/secrets/{name}"),
    ("delete", "/api/v1/secrets/{name}"),
    ("get", "/api/v1/audit"),
    ("get", "/api/v1/pauses"),
    ("put", "/api/v1/pauses/{kind}/{name}"),
    ("delete", "/api/v1/pauses/{kind}/{name}"),
    ("get", "/api/v1/schedules"),
    ("post", "/api/v1/schedules"),
    ("get", "/api/v1/schedules/{name}"),
    ("put", "/api/v1/schedules/{name}"),
    ("post", "/api/v1/schedules/{name}/run"),
    ("delete", "/api/v1/schedules/{name}"),
    ("post", "/api/v1/schedules/{name}/pause"),
    ("post", "/api/v1/schedules/{name}/resume"),
    ("get", "/api/v1/webhooks"),
    ("post", "/api/v1/webhooks/{name}"),
    ("put", "/api/v1/webhooks/{name}/credential"),
    ("get", "/api/v1/rules"),
    ("post", "/api/v1/rules"),
    ("put", "/api/v1/rules/{ref}/enabled"),
    ("delete", "/api/v1/rules/{ref}"),
    ("get", "/api/v1/events"),
    ("get", "/api/v1/events/{id}"),
    ("post", "/api/v1/events/{id}/replay"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/api/v1/openapi.json"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_documented_served_and_in_the_readme() {
    let system = System::builder().start().await;
    let (status, document) = system.request(reqwest::Method::GET, "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, 200);
    assert!(document["openapi"].as_str().unwrap().starts_with("3."), "{document}");

    let mut documented = BTreeSet::new();
    let mut operation_ids = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            documented.insert((method.clone(), path.clone()));
            let id = operation["operationId"].as_str().unwrap_or_default().to_string();
            assert!(operation_ids.insert(id.clone()), "{method} {path}: operationId '{id}' is not unique");
            if path.starts_with("/api/v1") {
                assert!(operation["responses"]["401"].is_object(), "{method} {path} does not document 401");
            }
            let responses = operation["responses"].as_object().unwrap();
            assert!(!responses.is_empty(), "{method} {path} documents no response");
            if path.starts_with("/api/v1") {
                let has_error_shape = responses
                    .iter()
                    .any(|(code, r)| code.starts_with('4') && r.to_string().contains("#/components/schemas/ErrorBody"));
                let only_success = responses.keys().all(|c| c.starts_with('2'));
                assert!(has_error_shape || only_success, "{method} {path}: error responses without the error shape");
            }
        }
    }
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .filter(|(_, p)| *p != "/api/v1/openapi.json")
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, expected, "the document and the route list differ");

    // Request bodies and the error shape are described.
    let schemas = &document["components"]["schemas"];
    for schema in ["CreateExecution", "Execution", "ExecutionStatus", "ErrorBody", "RetryBody", "WorkerView"] {
        assert!(schemas[schema].is_object(), "schema {schema} missing");
    }
    assert_eq!(document["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

    // Every documented route is served (no "no such route" fallback), and an undocumented one is not.
    for (method, path) in ROUTES {
        let concrete = path.replace("{id}", "1").replace("{action_ref}", "core.echo").replace("{name}", "nope");
        let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let body = (method == reqwest::Method::POST || method == reqwest::Method::PUT)
            .then(|| Value::Object(Default::default()));
        let (_, response) = system.request(method.clone(), &concrete, body.as_ref(), Some(&system.token)).await;
        assert_ne!(response["error"]["message"], "no such route", "{method} {path} is documented but not served");
    }
    let (status, response) = system.get("/api/v1/nothing-here").await;
    assert_eq!((status, response["error"]["message"].as_str()), (404, Some("no such route")));

    // The book's route table (Using it) names the same routes.
    let readme = std::fs::read_to_string(repo_root().join("book/src/using-it.md")).unwrap();
    for (method, path) in ROUTES {
        let shown = format!("{} {}", method.to_uppercase(), path);
        assert!(
            readme.contains(&shown) || readme.contains(&format!("`{shown}`")),
            "book/src/using-it.md does not list {shown}"
        );
    }
    system.stop().await;
}
