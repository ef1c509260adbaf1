//! Roles, in process: the router served on port 0 against a database and a broker namespace of
//! the test's own (no executor or worker), called with a token of each role (every route × every
//! role runs against the real binary: tests/tests/security/roles.rs): expired and revoked tokens are
//! refused; executions record who submitted, retried, canceled
//! and failed them; the admin token routes.

use attune_api::roles::Role;
use attune_common::db;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
mod support;

use support::Served;

/// A token of the test's: its id and the token itself.
struct Token {
    id: i64,
    secret: String,
}

/// The test's API with a token of each role.
struct Api {
    served: Served,
    /// One token of each role, in `Role::ALL`'s order.
    tokens: Vec<Token>,
}

impl std::ops::Deref for Api {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

impl Api {
    async fn start() -> Api {
        let served = Served::start(|_| {}).await;
        let mut tokens = Vec::new();
        for role in Role::ALL {
            let (info, secret) = db::token::create_with(&served.db.pool, role.as_str(), role, None).await.unwrap();
            tokens.push(Token { id: info.id, secret });
        }
        Api { served, tokens }
    }

    fn token(&self, role: Role) -> &Token {
        &self.tokens[Role::ALL.iter().position(|r| *r == role).unwrap()]
    }

    async fn call(&self, role: Role, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call_as(&self.token(role).secret, method, path, body).await
    }

    async fn stop(self) {
        self.served.stop().await;
    }
}

#[tokio::test]
async fn expired_and_revoked_tokens_are_refused_and_a_revocation_here_counts_at_once() {
    let api = Api::start().await;
    let yesterday = chrono::Utc::now() - chrono::Duration::days(1);
    let (_, expired) = db::token::create_with(&api.db.pool, "old", Role::Admin, Some(yesterday)).await.unwrap();
    let (status, answer) = api.call_as(&expired, Method::GET, "/api/v1/workers", None).await;
    assert_eq!((status, answer["error"]["message"].as_str()), (StatusCode::UNAUTHORIZED, Some("token expired")));
    assert_eq!(db::token::verify(&api.db.pool, &expired).await.unwrap(), None);
    // one that expires later works until then
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let (info, later) = db::token::create_with(&api.db.pool, "later", Role::Read, Some(tomorrow)).await.unwrap();
    let (status, me) = api.call_as(&later, Method::GET, "/api/v1/whoami", None).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        (me["token_id"].as_i64(), me["name"].as_str(), me["role"].as_str()),
        (Some(info.id), Some("later"), Some("read"))
    );
    assert!(me["expires"].is_string(), "{me}");

    // revoked in the database before its first use
    let (revoked_info, revoked) = db::token::create_with(&api.db.pool, "gone", Role::Operator, None).await.unwrap();
    db::token::revoke(&api.db.pool, revoked_info.id).await.unwrap().unwrap();
    let (status, answer) = api.call_as(&revoked, Method::GET, "/api/v1/workers", None).await;
    assert_eq!(
        (status, answer["error"]["message"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unknown or revoked token"))
    );

    // revoked through this API while it is trusted from the cache: refused at the next call
    let operator = api.token(Role::Operator);
    let (status, _) = api.call_as(&operator.secret, Method::GET, "/api/v1/workers", None).await;
    assert_eq!(status, StatusCode::OK);
    let path = format!("/api/v1/tokens/{}", operator.id);
    let (status, answer) = api.call(Role::Admin, Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer["revoked"].is_string() && answer.get("token").is_none(), "{answer}");
    let (status, answer) = api.call_as(&operator.secret, Method::GET, "/api/v1/workers", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    api.stop().await;
}

#[tokio::test]
async fn admins_create_list_and_revoke_tokens_through_the_api() {
    let api = Api::start().await;
    let (status, created) = api
        .call(
            Role::Admin,
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "ci", "role": "read", "expires_in_secs": 3600})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let secret = created["token"].as_str().unwrap();
    assert!(secret.starts_with("attune_"), "{created}");
    let expires = chrono::DateTime::parse_from_rfc3339(created["expires"].as_str().unwrap()).unwrap();
    let lifetime = expires.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(lifetime > chrono::Duration::minutes(59) && lifetime <= chrono::Duration::hours(1), "{lifetime}");
    let (status, me) = api.call_as(secret, Method::GET, "/api/v1/whoami", None).await;
    assert_eq!((status, me["role"].as_str(), me["name"].as_str()), (StatusCode::OK, Some("read"), Some("ci")));
    // JSON Schema's integers include 60.0
    let body = json!({"name": "whole", "role": "operator", "expires_in_secs": 60.0});
    let (status, whole) = api.call(Role::Admin, Method::POST, "/api/v1/tokens", Some(body)).await;
    assert_eq!((status, whole["role"].as_str()), (StatusCode::CREATED, Some("operator")), "{whole}");

    // the list: every token, never a token or its hash
    let (status, list) = api.call(Role::Admin, Method::GET, "/api/v1/tokens", None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<(&str, &str)> =
        list.as_array().unwrap().iter().map(|t| (t["name"].as_str().unwrap(), t["role"].as_str().unwrap())).collect();
    assert_eq!(
        names,
        [("read", "read"), ("operator", "operator"), ("admin", "admin"), ("ci", "read"), ("whole", "operator")]
    );
    let text = list.to_string();
    assert!(!text.contains(secret) && !text.contains("token_hash") && !text.contains("\"token\""), "{text}");

    // bad requests name their field; an admin cannot revoke the token it calls with
    for (body, parameter) in [
        (json!({"name": "x", "role": "root"}), "role"),
        (json!({"name": "", "role": "read"}), "name"),
        (json!({"name": "x", "role": "read", "expires_in_secs": 0}), "expires_in_secs"),
        (json!({"name": "x", "role": "read", "expires_in_secs": 1.5}), "expires_in_secs"),
        (json!({"name": "x", "role": "read", "expires_in_secs": 315_360_001}), "expires_in_secs"),
        (json!({"name": "x"}), "role"),
    ] {
        let (status, answer) = api.call(Role::Admin, Method::POST, "/api/v1/tokens", Some(body.clone())).await;
        assert_eq!(
            (status, answer["error"]["parameter"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(parameter)),
            "{body}: {answer}"
        );
    }
    let own = format!("/api/v1/tokens/{}", api.token(Role::Admin).id);
    let (status, answer) = api.call(Role::Admin, Method::DELETE, &own, None).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("own_token")), "{answer}");
    let (status, answer) = api.call(Role::Admin, Method::DELETE, "/api/v1/tokens/987654321", None).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("token_not_found")));
    let ci = created["id"].as_i64().unwrap();
    let (status, first) = api.call(Role::Admin, Method::DELETE, &format!("/api/v1/tokens/{ci}"), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, again) = api.call(Role::Admin, Method::DELETE, &format!("/api/v1/tokens/{ci}"), None).await;
    assert_eq!(
        (status, &again["revoked"]),
        (StatusCode::OK, &first["revoked"]),
        "a second revoke keeps the first time"
    );
    let (status, _) = api.call_as(secret, Method::GET, "/api/v1/whoami", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    api.stop().await;
}

#[tokio::test]
async fn executions_record_who_submitted_retried_canceled_and_failed_them() {
    let api = Api::start().await;
    let (operator, admin) = (api.token(Role::Operator).id, api.token(Role::Admin).id);
    let submit = |role: Role, key: Option<&'static str>| {
        let api = &api;
        async move {
            let mut request = api
                .http
                .post(format!("{}/api/v1/executions", api.url))
                .bearer_auth(&api.token(role).secret)
                .json(&json!({"action_ref": "core.echo", "parameters": {"message": "hi"}}));
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), StatusCode::CREATED);
            response.json::<Value>().await.unwrap()
        }
    };
    // a submission names its token, with or without an Idempotency-Key
    let first = submit(Role::Operator, None).await;
    assert_eq!((first["submitted_by"].as_i64(), &first["ended_by"]), (Some(operator), &Value::Null), "{first}");
    let keyed = submit(Role::Admin, Some("roles-test")).await;
    assert_eq!(keyed["submitted_by"].as_i64(), Some(admin), "{keyed}");
    let id = first["id"].as_i64().unwrap();

    // the admin cancels it: recorded in the row and shown with the token's name
    let (status, canceled) =
        api.call(Role::Admin, Method::POST, &format!("/api/v1/executions/{id}/cancel"), None).await;
    assert_eq!((status, canceled["status"].as_str()), (StatusCode::OK, Some("canceled")), "{canceled}");
    assert_eq!(canceled["ended_by"].as_i64(), Some(admin));
    let (_, view) = api.call(Role::Read, Method::GET, &format!("/api/v1/executions/{id}"), None).await;
    assert_eq!(
        (
            view["submitted_by"].as_i64(),
            view["submitted_by_name"].as_str(),
            view["ended_by"].as_i64(),
            view["ended_by_name"].as_str()
        ),
        (Some(operator), Some("operator"), Some(admin), Some("admin")),
        "{view}"
    );
    let stored = db::execution::get(&api.db.pool, id).await.unwrap().unwrap();
    assert_eq!((stored.submitted_by, stored.ended_by), (Some(operator), Some(admin)));

    // a manual retry is the asking token's (here the admin's, of the operator's execution)
    let (status, retry) = api.call(Role::Admin, Method::POST, &format!("/api/v1/executions/{id}/retry"), None).await;
    assert_eq!(status, StatusCode::CREATED, "{retry}");
    assert_eq!((retry["submitted_by"].as_i64(), retry["retry_reason"].as_str()), (Some(admin), Some("manual_retry")));
    // ... and the operator fails it, stuck: recorded too
    let retry_id = retry["id"].as_i64().unwrap();
    let (status, failed) = api
        .call(
            Role::Operator,
            Method::POST,
            &format!("/api/v1/executions/{retry_id}/fail"),
            Some(json!({"reason": "stuck"})),
        )
        .await;
    assert_eq!((status, failed["ended_by"].as_i64()), (StatusCode::OK, Some(operator)), "{failed}");

    // an automatic retry (inserted by the RetryManager, with no token) keeps its parent's submitter
    let parent = db::execution::get(&api.db.pool, retry_id).await.unwrap().unwrap();
    let automatic = db::execution::NewExecution::retry_of(
        &parent,
        attune_core::ExecutionStatus::Delayed,
        attune_core::FailureKind::Timeout,
        None,
        Some(chrono::Utc::now()),
    );
    let automatic = db::execution::insert(&api.db.pool, &automatic).await.unwrap();
    assert_eq!((automatic.submitted_by, automatic.ended_by), (Some(admin), None));
    // ... and a row no token asked for names none
    let action = db::action::get_by_ref(&api.db.pool, "core.echo").await.unwrap().unwrap();
    let system_row = db::execution::insert(&api.db.pool, &attune_testkit::echo_execution(&action)).await.unwrap();
    assert_eq!(system_row.submitted_by, None);
    let (_, view) = api.call(Role::Read, Method::GET, &format!("/api/v1/executions/{}", system_row.id), None).await;
    assert_eq!((&view["submitted_by"], &view["submitted_by_name"]), (&Value::Null, &Value::Null), "{view}");
    api.stop().await;
}
