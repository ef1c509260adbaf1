//! The audit trail: every request to a route that could change state writes its row (a refusal
//! too), with who asked, the answer, what it made and the reason given; the trail is read by
//! admins alone and no one changes a row of it.

use attune_api::roles::{REQUIRED, Role};
use attune_common::db;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
mod support;

use support::Served;

/// A path of `template` with its parameters filled in.
fn concrete(template: &str) -> String {
    template
        .replace("{id}", "999999")
        .replace("{name}", "audited")
        .replace("{action_ref}", "core.echo")
        .replace("{kind}", "runtime")
}

async fn send(
    api: &Served,
    token: &str,
    method: Method,
    path: &str,
    reason: Option<&str>,
    body: Option<Value>,
) -> StatusCode {
    let mut request = api.http.request(method, format!("{}{path}", api.url)).bearer_auth(token);
    if let Some(reason) = reason {
        request = request.header("X-Attune-Reason", reason);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap().status()
}

async fn events(api: &Served, token: &str, query: &str) -> Vec<Value> {
    let (status, page) = api.call_as(token, Method::GET, &format!("/api/v1/audit?{query}"), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["events"].as_array().unwrap().clone()
}

#[tokio::test]
async fn every_route_that_can_change_state_writes_an_audit_row_whatever_its_answer() {
    let api = Served::start(|_| {}).await;
    let (admin_info, admin) = db::token::create_with(&api.db.pool, "alice", Role::Admin, None).await.unwrap();
    let changing: Vec<_> = REQUIRED.iter().filter(|(method, _, _)| *method != Method::GET).collect();
    assert!(changing.len() >= 8, "{changing:?}");
    for (n, (method, template, _)) in changing.iter().enumerate() {
        let reason = format!("audit check {n}");
        let body = (*method != Method::DELETE).then(|| json!({}));
        let status = send(&api, &admin, method.clone(), &concrete(template), Some(&reason), body).await;
        let rows = events(&api, &admin, &format!("route={}", urlencode(template))).await;
        let row = rows
            .iter()
            .find(|row| row["reason"] == json!(reason))
            .unwrap_or_else(|| panic!("no audit row for {method} {template} (answered {status}): {rows:?}"));
        assert_eq!(row["status"], json!(status.as_u16()), "{row}");
        assert_eq!(
            (row["token_id"].as_i64(), row["token_name"].as_str()),
            (Some(admin_info.id), Some("alice")),
            "{row}"
        );
        assert_eq!(row["role"], json!("admin"));
        assert_eq!(
            (row["method"].as_str(), row["path"].as_str()),
            (Some(method.as_str()), Some(concrete(template).as_str()))
        );
    }

    // a submission names the execution it made; a refusal by role is written with the role
    let (status, made) = api
        .call_as(
            &admin,
            Method::POST,
            "/api/v1/executions",
            Some(json!({"action_ref": "core.echo", "parameters": {"message": "hi"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let target = format!("execution:{}", made["id"]);
    let rows = events(&api, &admin, &format!("target={target}")).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0]["status"].as_u64(), rows[0]["reason"].is_null()), (Some(201), true));
    let (_, reader) = db::token::create_with(&api.db.pool, "bob", Role::Read, None).await.unwrap();
    let refused = send(&api, &reader, Method::POST, "/api/v1/executions/1/cancel", Some("just looking"), None).await;
    assert_eq!(refused, StatusCode::FORBIDDEN);
    let rows = events(&api, &admin, "actor=bob").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0]["status"].as_u64(), rows[0]["role"].as_str()), (Some(403), Some("read")));
    assert_eq!(rows[0]["reason"], json!("just looking"));

    // only admins read the trail
    let (status, _) = api.call_as(&reader, Method::GET, "/api/v1/audit", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // newest first, a page at a time
    let first = events(&api, &admin, "limit=2").await;
    let (_, page) = api.call_as(&admin, Method::GET, "/api/v1/audit?limit=2", None).await;
    let older = events(&api, &admin, &format!("limit=2&before={}", page["next_before"])).await;
    assert!(first[0]["id"].as_i64() > first[1]["id"].as_i64() && first[1]["id"].as_i64() > older[0]["id"].as_i64());
    for bad in ["limit=0", "limit=1001", "since=yesterday", "unknown=1"] {
        let (status, body) = api.call_as(&admin, Method::GET, &format!("/api/v1/audit?{bad}"), None).await;
        assert!(status.is_client_error(), "{bad}: {status} {body}");
    }
    api.stop().await;
}

#[tokio::test]
async fn a_malformed_reason_is_refused_before_anything_changes_and_no_row_is_ever_changed() {
    let api = Served::start(|_| {}).await;
    let (_, admin) = db::token::create_with(&api.db.pool, "alice", Role::Admin, None).await.unwrap();
    let submit = json!({"action_ref": "core.echo", "parameters": {"message": "hi"}});
    for reason in ["tab\there", &"x".repeat(1001)] {
        let response = api
            .http
            .post(format!("{}/api/v1/executions", api.url))
            .bearer_auth(&admin)
            .header("X-Attune-Reason", reason)
            .json(&submit)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["parameter"], json!("X-Attune-Reason"), "{body}");
    }
    let executions: i64 = sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(&api.db.pool).await.unwrap();
    assert_eq!(executions, 0, "a refused request created an execution");
    // a reason of 1,000 characters (2,000 bytes of UTF-8) is taken whole
    let long = "é".repeat(1000);
    assert_eq!(
        send(&api, &admin, Method::POST, "/api/v1/executions", Some(&long), Some(submit)).await,
        StatusCode::CREATED
    );
    let (_, page) = api.call_as(&admin, Method::GET, "/api/v1/audit?route=/api/v1/executions", None).await;
    assert_eq!(page["events"][0]["reason"], json!(long));

    // append-only: not even the schema's owner changes a row
    let changed = sqlx::query("UPDATE audit_event SET reason = 'rewritten'").execute(&api.db.pool).await;
    let error = changed.expect_err("an audit row was changed");
    assert!(error.to_string().contains("append-only"), "{error}");
    api.stop().await;
}

fn urlencode(text: &str) -> String {
    text.replace('{', "%7B").replace('}', "%7D")
}
