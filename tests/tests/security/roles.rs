//! Roles with the real binaries, as an operator sets them up: `attune token create --role`, a
//! `read` token refused a submission (403 naming `operator`) and shown no Retry or Cancel on the
//! dashboard, an `operator` token whose submission and cancel are recorded as its own, `attune
//! token list` (never a token) and `attune token revoke` (by name, by id, refusing an ambiguous
//! name), after which the token is refused. And every route of the OpenAPI document called with
//! every role, so that a new route is covered the day it is added.

use std::process::{Command, Output};

use attune_api::roles::{REQUIRED, Role, required};
use attune_testkit::System;
use attune_testkit::browser::Browser;
use reqwest::Method;
use serde_json::{Value, json};

/// `attune` against `system`, with `token` as its API token.
fn attune(system: &System, token: &str, args: &[&str]) -> Output {
    Command::new(attune_testkit::workspace_binary("attune"))
        .args(args)
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", token)
        .env("DATABASE_URL", &system.db.url)
        .output()
        .expect("run attune")
}

/// `attune ... --output json`, which must succeed, as JSON.
fn attune_json(system: &System, token: &str, args: &[&str]) -> Value {
    let out = attune(system, token, &[args, &["--output", "json"]].concat());
    assert!(out.status.success(), "attune {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("attune {args:?}: {e}"))
}

/// The lifetime `token` was given, from its `expires` (RFC 3339), if it has one.
fn lifetime(token: &Value) -> Option<chrono::Duration> {
    let expires = chrono::DateTime::parse_from_rfc3339(token["expires"].as_str()?).unwrap();
    Some(expires.with_timezone(&chrono::Utc) - chrono::Utc::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_made_without_a_lifetime_get_the_default_expiry_where_one_is_set() {
    let system = System::builder().env("ATTUNE_TOKEN_DEFAULT_EXPIRY", "2h").start().await;
    let day = chrono::Duration::days(1);
    let about = |lifetime: Option<chrono::Duration>, expected: chrono::Duration| {
        lifetime.is_some_and(|l| l <= expected && l > expected - chrono::Duration::minutes(1))
    };
    // the CLI, with the setting in its environment
    let cli = |args: &[&str], default: Option<&str>| {
        let mut command = Command::new(attune_testkit::workspace_binary("attune"));
        command.args(args).args(["--output", "json"]).env("DATABASE_URL", &system.db.url);
        if let Some(default) = default {
            command.env("ATTUNE_TOKEN_DEFAULT_EXPIRY", default);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let made = cli(&["token", "create", "--name", "a", "--role", "read"], Some("1d"));
    assert!(about(lifetime(&made), day), "{made}");
    let made = cli(&["token", "create", "--name", "b", "--role", "read", "--expires-in", "30d"], Some("1d"));
    assert!(about(lifetime(&made), day * 30), "an explicit lifetime wins: {made}");
    let made = cli(&["token", "create", "--name", "c", "--role", "read", "--expires-in", "never"], Some("1d"));
    assert_eq!(made["expires"], Value::Null, "never is never: {made}");
    let made = cli(&["token", "create", "--name", "d", "--role", "read"], None);
    assert_eq!(made["expires"], Value::Null, "without the setting tokens never expire: {made}");
    // a bad setting is refused, naming it
    let out = Command::new(attune_testkit::workspace_binary("attune"))
        .args(["token", "create", "--name", "e", "--role", "read"])
        .env("DATABASE_URL", &system.db.url)
        .env("ATTUNE_TOKEN_DEFAULT_EXPIRY", "soon")
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("ATTUNE_TOKEN_DEFAULT_EXPIRY"));

    // the API, started with the setting at 2 h
    let (status, made) = system
        .request(Method::POST, "/api/v1/tokens", Some(&json!({"name": "f", "role": "read"})), Some(&system.token))
        .await;
    assert_eq!(status, 201, "{made}");
    assert!(about(lifetime(&made), chrono::Duration::hours(2)), "{made}");
    let (status, made) = system
        .request(
            Method::POST,
            "/api/v1/tokens",
            Some(&json!({"name": "g", "role": "read", "expires_in_secs": 60})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert!(about(lifetime(&made), chrono::Duration::seconds(60)), "{made}");
    // a token with no role cannot be written, even by hand
    let unnamed =
        sqlx::query("INSERT INTO api_token (name, token_hash) VALUES ('h', '\\x01')").execute(&system.db.pool).await;
    assert!(unnamed.is_err(), "a token was written without a role");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_made_with_the_cli_carry_their_role_and_record_what_they_did() {
    // no worker: submissions stay requested, to be canceled; revocations count at once
    let system = System::builder().env("ATTUNE_TOKEN_CACHE_SECS", "0").start().await;

    // A read token: it reads, and a submission is refused naming the role it needs.
    let viewer = attune_json(&system, &system.token, &["token", "create", "--name", "viewer", "--role", "read"]);
    assert_eq!((viewer["role"].as_str(), &viewer["expires"]), (Some("read"), &Value::Null), "{viewer}");
    let viewer_token = viewer["token"].as_str().unwrap();
    let (status, _) = system.request(reqwest::Method::GET, "/api/v1/executions", None, Some(viewer_token)).await;
    assert_eq!(status, 200);
    let submission = json!({"action_ref": "core.echo", "parameters": {"message": "hi"}});
    let (status, refused) =
        system.request(reqwest::Method::POST, "/api/v1/executions", Some(&submission), Some(viewer_token)).await;
    assert_eq!(status, 403, "{refused}");
    let error = &refused["error"];
    assert_eq!(
        (error["code"].as_str(), error["required_role"].as_str(), error["role"].as_str()),
        (Some("forbidden"), Some("operator"), Some("read"))
    );
    // ... and the CLI says so
    let out = attune(&system, viewer_token, &["run", "core.echo", "message=hi"]);
    let told = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && told.contains("operator") && told.contains("read"), "{told}");

    // An operator token that expires in 30 days: its submission and its cancel are its own.
    let operator = attune_json(
        &system,
        &system.token,
        &["token", "create", "--name", "ops", "--role", "operator", "--expires-in", "30d"],
    );
    let expires = chrono::DateTime::parse_from_rfc3339(operator["expires"].as_str().unwrap()).unwrap();
    let lifetime = expires.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(lifetime > chrono::Duration::days(29) && lifetime <= chrono::Duration::days(30), "{lifetime}");
    let (operator_id, operator_token) = (operator["id"].as_i64().unwrap(), operator["token"].as_str().unwrap());
    let submitted = attune_json(&system, operator_token, &["run", "core.echo", "message=hi"]);
    assert_eq!(submitted["submitted_by"].as_i64(), Some(operator_id), "{submitted}");
    let id = submitted["id"].as_i64().unwrap().to_string();
    let canceled = attune_json(&system, operator_token, &["execution", "cancel", &id]);
    assert_eq!((canceled["status"].as_str(), canceled["ended_by"].as_i64()), (Some("canceled"), Some(operator_id)));
    let (_, shown) = system.get(&format!("/api/v1/executions/{id}")).await;
    assert_eq!((shown["submitted_by_name"].as_str(), shown["ended_by_name"].as_str()), (Some("ops"), Some("ops")));
    // the operator may not register packs or see the tokens
    let out =
        attune(&system, operator_token, &["pack", "register", &system.packs_dir().join("core").display().to_string()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("admin"), "{out:?}");

    // The dashboard: the read token sees who it is and no Retry or Cancel; the operator sees both.
    let browser = Browser::start().await;
    let page = format!("{}/ui/executions/{id}", system.api_url);
    for (token, who, buttons) in [(viewer_token, "viewer (read)", false), (operator_token, "ops (operator)", true)] {
        browser.goto(&format!("{}/ui/login", system.api_url)).await;
        browser.eval(&format!("sessionStorage.setItem('attune.token', {}); return null", json!(token))).await;
        browser.goto(&page).await;
        browser
            .wait("the execution page", "return document.querySelector('[data-fact=\"submitted by\"]')?.textContent")
            .await;
        assert_eq!(browser.wait("who is signed in", "return document.querySelector('#whoami').textContent").await, who);
        let shown = browser
            .eval("return [document.querySelector('#retry') !== null, document.querySelector('#cancel') !== null]")
            .await;
        assert_eq!(shown, json!([buttons, buttons]), "{who}");
        assert_eq!(browser.text("[data-fact=\"submitted by\"]").await, format!("ops (token #{operator_id})"));
        assert_eq!(browser.text("[data-fact=\"ended by\"]").await, format!("ops (token #{operator_id})"));
    }
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "{errors:#?}");

    // The list: every token with its role and state, never a token.
    let listed = attune_json(&system, &system.token, &["token", "list"]);
    let rows: Vec<(&str, &str)> =
        listed.as_array().unwrap().iter().map(|t| (t["name"].as_str().unwrap(), t["role"].as_str().unwrap())).collect();
    assert_eq!(rows, [("test", "admin"), ("viewer", "read"), ("ops", "operator")]);
    let out = attune(&system, &system.token, &["token", "list"]);
    let table = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Vec<&str>> = table.lines().map(|line| line.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["ID", "NAME", "ROLE", "STATE", "CREATED", "EXPIRES", "REVOKED"], "{table}");
    assert_eq!(lines[2][1..4], ["viewer", "read", "live"], "{table}");
    assert_eq!(lines[3][1..4], ["ops", "operator", "live"], "{table}");
    assert_eq!(lines[3].last(), Some(&"-"), "not revoked: {table}");
    assert!(!table.contains("attune_") && !listed.to_string().contains("attune_"), "{table}");

    // Revoked by name: refused from the next request.
    let revoked = attune_json(&system, &system.token, &["token", "revoke", "viewer"]);
    assert!(revoked["revoked"].is_string(), "{revoked}");
    let (status, answer) = system.request(reqwest::Method::GET, "/api/v1/executions", None, Some(viewer_token)).await;
    assert_eq!((status, answer["error"]["message"].as_str()), (401, Some("unknown or revoked token")));
    // two live tokens of one name: revoked by id only
    let first = attune_json(&system, &system.token, &["token", "create", "--name", "twin", "--role", "read"]);
    attune_json(&system, &system.token, &["token", "create", "--name", "twin", "--role", "read"]);
    let out = attune(&system, &system.token, &["token", "revoke", "twin"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("revoke one by its id"), "{out:?}");
    let by_id = attune_json(&system, &system.token, &["token", "revoke", &first["id"].to_string()]);
    assert_eq!((by_id["id"].as_i64(), by_id["name"].as_str()), (first["id"].as_i64(), Some("twin")));
    system.stop().await;
}

/// `path` with its parameters filled in with values that name nothing (so that an allowed call
/// changes nothing: it is a 404 or a 422).
fn concrete(path: &str) -> String {
    // (a `kind` that is none: a pause is refused, 422)
    let filled = path
        .replace("{id}", "987654321")
        .replace("{action_ref}", "core.nope")
        .replace("{name}", "nope")
        .replace("{ref}", "local.nope")
        .replace("{kind}", "nope");
    assert!(!filled.contains('{'), "{path}: give its path parameter a value in roles.rs `concrete`");
    filled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_of_the_document_answers_every_role_as_the_roles_table_says() {
    let system = System::builder().start().await;
    // a token of each role, as `attune token create --role` makes them
    let mut tokens = Vec::new();
    for role in Role::ALL {
        let (_, secret) =
            attune_common::db::token::create_with(&system.db.pool, role.as_str(), role, None).await.unwrap();
        tokens.push(secret);
    }
    let token = |role: Role| tokens[Role::ALL.iter().position(|r| *r == role).unwrap()].as_str();
    let (status, document) = system.request(Method::GET, "/api/v1/openapi.json", None, Some(token(Role::Read))).await;
    assert_eq!(status, 200);
    let mut calls = 0;
    let mut refusals = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        if !path.starts_with("/api/v1") {
            continue;
        }
        for (method, operation) in item.as_object().unwrap() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            // a webhook's delivery takes no API token (its own proof: tests/tests/submission/events.rs)
            if method == Method::POST && path == attune_api::routes::events::DELIVERY_PATH {
                assert!(operation["responses"]["403"].is_null(), "a delivery has no role to refuse: {operation}");
                continue;
            }
            let listed: Vec<Role> =
                REQUIRED.iter().filter(|(m, p, _)| *m == method && p == path).map(|(_, _, role)| *role).collect();
            assert_eq!(listed.len(), 1, "{method} {path}: decide who may call it in attune_api::roles::REQUIRED");
            let needed = listed[0];
            assert_eq!(required(&method, path), needed);
            if needed > Role::Read {
                let documented = operation["responses"]["403"]["description"].as_str().unwrap_or_default();
                assert!(documented.contains("forbidden"), "{method} {path} does not document its 403: {operation}");
            }
            for role in Role::ALL {
                let body = (method == Method::POST || method == Method::PUT).then(|| json!({}));
                let (status, answer) =
                    system.request(method.clone(), &concrete(path), body.as_ref(), Some(token(role))).await;
                calls += 1;
                if role >= needed {
                    assert!(
                        status != 403 && status != 401,
                        "{method} {path} as {role} (needs {needed}): {status} {answer}"
                    );
                } else {
                    refusals += 1;
                    assert_eq!(status, 403, "{method} {path} as {role}: {answer}");
                    let error = &answer["error"];
                    assert_eq!(error["code"], "forbidden", "{method} {path} as {role}: {answer}");
                    assert_eq!(
                        (error["required_role"].as_str(), error["role"].as_str()),
                        (Some(needed.as_str()), Some(role.as_str()))
                    );
                    let message = error["message"].as_str().unwrap();
                    assert!(message.contains(needed.as_str()) && message.contains(role.as_str()), "{message}");
                }
            }
        }
    }
    // every entry of the table was a route of the document, called with each role, and refused
    // to each role below the one it needs
    let expected_refusals: usize =
        REQUIRED.iter().map(|(_, _, needed)| Role::ALL.iter().filter(|role| *role < needed).count()).sum();
    assert_eq!((calls, refusals), (REQUIRED.len() * Role::ALL.len(), expected_refusals));
    assert!(REQUIRED.len() >= 20 && refusals >= 12, "{} routes, {refusals} refusals", REQUIRED.len());
    system.stop().await;
}
