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
        .replace("{ref}", "local.audited")
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

/// Makes every insert into `audit_event` fail in the test's database (as a full disk, a lost
/// grant or a bug in the row would), until `allow_audit_rows`.
async fn refuse_audit_rows(api: &Served) {
    for statement in [
        "CREATE FUNCTION refuse_audit_row() RETURNS trigger LANGUAGE plpgsql AS \
            $$ BEGIN RAISE EXCEPTION 'audit rows refused by the test'; END $$",
        "CREATE TRIGGER refuse_audit_row BEFORE INSERT ON audit_event FOR EACH ROW EXECUTE FUNCTION refuse_audit_row()",
    ] {
        sqlx::query(statement).execute(&api.db.pool).await.unwrap();
    }
}

async fn allow_audit_rows(api: &Served) {
    sqlx::query("DROP TRIGGER refuse_audit_row ON audit_event").execute(&api.db.pool).await.unwrap();
}

async fn audit_rows(api: &Served) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_event").fetch_one(&api.db.pool).await.unwrap()
}

#[tokio::test]
async fn a_change_whose_audit_row_cannot_be_written_is_not_made() {
    let api = Served::start(|_| {}).await;
    let (_, admin) = db::token::create_with(&api.db.pool, "alice", Role::Admin, None).await.unwrap();
    let (victim, _) = db::token::create_with(&api.db.pool, "victim", Role::Read, None).await.unwrap();
    let (status, made) = api
        .call_as(
            &admin,
            Method::POST,
            "/api/v1/executions",
            Some(json!({"action_ref": "core.echo", "parameters": {"message": "hi"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let id = made["id"].as_i64().unwrap();
    let (status, made) = api
        .call_as(
            &admin,
            Method::POST,
            "/api/v1/schedules",
            Some(json!({"name": "nightly", "action_ref": "core.echo", "parameters": {"message": "hi"}, "cron": "0 0 * * *"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let rows_before = audit_rows(&api).await;

    refuse_audit_rows(&api).await;
    let changes = [
        (Method::POST, format!("/api/v1/executions/{id}/cancel"), None),
        (Method::POST, format!("/api/v1/executions/{id}/fail"), Some(json!({"reason": "stuck"}))),
        (
            Method::POST,
            "/api/v1/executions/bulk".to_string(),
            Some(json!({"action": "cancel", "filter": {"status": "requested"}, "reason": "drain"})),
        ),
        (Method::DELETE, format!("/api/v1/tokens/{}", victim.id), None),
        (Method::PUT, "/api/v1/pauses/runtime/shell".to_string(), Some(json!({"reason": "maintenance"}))),
        (Method::POST, "/api/v1/schedules/nightly/pause".to_string(), None),
        (Method::POST, "/api/v1/schedules/nightly/run".to_string(), None),
        (Method::DELETE, "/api/v1/schedules/nightly".to_string(), None),
        (Method::POST, "/api/v1/tokens".to_string(), Some(json!({"name": "new", "role": "read"}))),
        (
            Method::PUT,
            "/api/v1/actions/core.echo/concurrency".to_string(),
            Some(json!({"limit": 1, "reason": "one at a time"})),
        ),
    ];
    for (method, path, body) in changes {
        let (status, answer) = api.call_as(&admin, method.clone(), &path, body).await;
        assert!(status.is_server_error(), "{method} {path} answered {status} without its audit row: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_else(|| panic!("{method} {path}: {answer}"));
        assert!(!message.contains("nothing was written"), "{method} {path}: {answer}");
    }
    // none of them happened
    let execution = db::execution::get(&api.db.pool, id).await.unwrap().unwrap();
    assert_eq!(execution.status.as_str(), "requested", "canceled or failed without an audit row");
    let victim_now = db::token::get(&api.db.pool, victim.id).await.unwrap().unwrap();
    assert!(victim_now.revoked.is_none(), "revoked without an audit row");
    let pauses: i64 = sqlx::query_scalar("SELECT count(*) FROM pause").fetch_one(&api.db.pool).await.unwrap();
    assert_eq!(pauses, 0, "paused without an audit row");
    let schedule = db::schedule::get(&api.db.pool, "nightly").await.unwrap();
    assert!(
        schedule.is_some_and(|schedule| !schedule.paused),
        "the schedule was paused or deleted without an audit row"
    );
    let tokens: i64 = sqlx::query_scalar("SELECT count(*) FROM api_token").fetch_one(&api.db.pool).await.unwrap();
    assert_eq!(tokens, 2, "a token was made without an audit row");
    let action = db::action::get_by_ref(&api.db.pool, "core.echo").await.unwrap().unwrap();
    assert!(action.concurrency_set.is_none(), "a concurrency policy was set without an audit row");

    // once rows can be written again, the same change is made with exactly one
    allow_audit_rows(&api).await;
    assert_eq!(audit_rows(&api).await, rows_before);
    let (status, canceled) = api.call_as(&admin, Method::POST, &format!("/api/v1/executions/{id}/cancel"), None).await;
    assert_eq!((status, canceled["status"].as_str()), (StatusCode::OK, Some("canceled")), "{canceled}");
    assert_eq!(audit_rows(&api).await, rows_before + 1);
    api.stop().await;
}

/// `method path` as `token` with the reason `reason` (and `body` as JSON, `headers` besides): the
/// status and the answer.
async fn change(
    api: &Served,
    token: &str,
    (method, path, body): (Method, &str, Option<Value>),
    reason: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut request = api.http.request(method, format!("{}{path}", api.url)).bearer_auth(token);
    request = request.header("X-Attune-Reason", reason);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    support::answer(request.send().await.unwrap()).await
}

#[tokio::test]
async fn each_change_a_route_makes_writes_exactly_one_audit_row_with_its_answer() {
    let api =
        Served::start(|settings| settings.sealer = Some(attune_common::secrets::Sealer::from_key(&[7; 32]))).await;
    let (_, admin) = db::token::create_with(&api.db.pool, "alice", Role::Admin, None).await.unwrap();
    let echo = |message: &str| json!({"action_ref": "core.echo", "parameters": {"message": message}});
    // (method, path, body), extra headers, the status expected, the target expected: every
    // route that changes state, each making its change
    let mut sent: Vec<(String, StatusCode, Option<String>)> = Vec::new();
    let mut expect =
        |reason: String, (status, answer): (StatusCode, Value), want: StatusCode, target: Option<String>| {
            assert_eq!(status, want, "{reason}: {answer}");
            sent.push((reason, status, target));
            answer
        };
    let mut ids = Vec::new();
    for n in 0..4 {
        let reason = format!("submit {n}");
        let made = change(&api, &admin, (Method::POST, "/api/v1/executions", Some(echo("hi"))), &reason, &[]).await;
        let target = Some(format!("execution:{}", made.1["id"]));
        ids.push(expect(reason, made, StatusCode::CREATED, target)["id"].as_i64().unwrap());
    }
    let keyed = (Method::POST, "/api/v1/executions", Some(echo("keyed")));
    let made = change(&api, &admin, keyed.clone(), "keyed", &[("Idempotency-Key", "k-1")]).await;
    let target = Some(format!("execution:{}", made.1["id"]));
    expect("keyed".into(), made, StatusCode::CREATED, target);
    // a repeat changes nothing, and is written by the middleware: still one row
    let repeat = change(&api, &admin, keyed, "keyed again", &[("Idempotency-Key", "k-1")]).await;
    let target = Some(format!("execution:{}", repeat.1["id"]));
    expect("keyed again".into(), repeat, StatusCode::OK, target);
    for (n, id) in ids[..2].iter().enumerate() {
        let path = format!("/api/v1/executions/{id}/cancel");
        let canceled = change(&api, &admin, (Method::POST, &path, None), &format!("cancel {n}"), &[]).await;
        expect(format!("cancel {n}"), canceled, StatusCode::OK, None);
    }
    let path = format!("/api/v1/executions/{}/retry", ids[0]);
    let retried = change(&api, &admin, (Method::POST, &path, None), "retry", &[]).await;
    let target = Some(format!("execution:{}", retried.1["id"]));
    expect("retry".into(), retried, StatusCode::CREATED, target);
    let body = json!({"action_ref": "core.echo", "config": {"retry_of": ids[1]}});
    let retried = change(&api, &admin, (Method::POST, "/api/v1/executions", Some(body)), "retry_of", &[]).await;
    let target = Some(format!("execution:{}", retried.1["id"]));
    expect("retry_of".into(), retried, StatusCode::CREATED, target);
    let path = format!("/api/v1/executions/{}/fail", ids[2]);
    let failed = change(&api, &admin, (Method::POST, &path, Some(json!({"reason": "stuck"}))), "fail", &[]).await;
    expect("fail".into(), failed, StatusCode::OK, None);
    let bulk = json!({"action": "cancel", "filter": {"status": "requested"}, "reason": "drain"});
    let bulked = change(&api, &admin, (Method::POST, "/api/v1/executions/bulk", Some(bulk)), "bulk", &[]).await;
    let selected = bulked.1["selected"].as_array().unwrap().len();
    assert_eq!((selected, bulked.1["done"].as_array().unwrap().len()), (4, 4), "{}", bulked.1);
    expect("bulk".into(), bulked, StatusCode::OK, Some(format!("executions:{selected}")));

    let concurrency = "/api/v1/actions/core.echo/concurrency";
    let set =
        change(&api, &admin, (Method::PUT, concurrency, Some(json!({"limit": 2, "reason": "r"}))), "limit", &[]).await;
    expect("limit".into(), set, StatusCode::OK, Some("action:core.echo".into()));
    let cleared = change(&api, &admin, (Method::DELETE, concurrency, None), "unlimit", &[]).await;
    expect("unlimit".into(), cleared, StatusCode::OK, Some("action:core.echo".into()));
    let pack = change(&api, &admin, (Method::POST, "/api/v1/packs", Some(json!({"path": "core"}))), "pack", &[]).await;
    expect("pack".into(), pack, StatusCode::CREATED, Some("pack:core".into()));

    let token = json!({"name": "ci", "role": "read"});
    let made = change(&api, &admin, (Method::POST, "/api/v1/tokens", Some(token)), "token", &[]).await;
    let token_id = made.1["id"].as_i64().unwrap();
    expect("token".into(), made, StatusCode::CREATED, Some(format!("token:{token_id}")));
    let path = format!("/api/v1/tokens/{token_id}");
    let revoked = change(&api, &admin, (Method::DELETE, &path, None), "revoke", &[]).await;
    expect("revoke".into(), revoked, StatusCode::OK, None);
    let secret = "/api/v1/secrets/db_password";
    let set =
        change(&api, &admin, (Method::PUT, secret, Some(json!({"value": "hunter2", "users": ["*"]}))), "secret", &[])
            .await;
    expect("secret".into(), set, StatusCode::OK, None);
    let deleted = change(&api, &admin, (Method::DELETE, secret, None), "unsecret", &[]).await;
    expect("unsecret".into(), deleted, StatusCode::NO_CONTENT, None);

    // (an event and a webhook this test has none of: refused, and audited with the refusal)
    let replayed = change(&api, &admin, (Method::POST, "/api/v1/events/424242/replay", None), "replay", &[]).await;
    expect("replay".into(), replayed, StatusCode::NOT_FOUND, None);
    let rule = json!({"name": "audited", "trigger": "attune.execution.exhausted", "action": "core.echo",
        "parameters": {"message": "{{ payload.execution.action }}"}});
    let made = change(&api, &admin, (Method::POST, "/api/v1/rules", Some(rule)), "rule", &[]).await;
    expect("rule".into(), made, StatusCode::CREATED, Some("rule:local.audited".into()));
    let enabled = (Method::PUT, "/api/v1/rules/local.audited/enabled", Some(json!({"enabled": false})));
    let disabled = change(&api, &admin, enabled, "disable rule", &[]).await;
    expect("disable rule".into(), disabled, StatusCode::OK, Some("rule:local.audited".into()));
    let deleted = change(&api, &admin, (Method::DELETE, "/api/v1/rules/local.audited", None), "unrule", &[]).await;
    expect("unrule".into(), deleted, StatusCode::NO_CONTENT, Some("rule:local.audited".into()));
    let drained = change(&api, &admin, (Method::PUT, "/api/v1/workers/nope/drain", None), "drain", &[]).await;
    expect("drain".into(), drained, StatusCode::NOT_FOUND, None);
    let undrained = change(&api, &admin, (Method::DELETE, "/api/v1/workers/nope/drain", None), "undrain", &[]).await;
    expect("undrain".into(), undrained, StatusCode::NOT_FOUND, None);
    let credential = (Method::PUT, "/api/v1/webhooks/nope/credential", Some(json!({})));
    let set_credential = change(&api, &admin, credential, "credential", &[]).await;
    expect("credential".into(), set_credential, StatusCode::NOT_FOUND, None);

    let pause = "/api/v1/pauses/action/core.echo";
    let paused = change(&api, &admin, (Method::PUT, pause, Some(json!({"reason": "r"}))), "pause", &[]).await;
    expect("pause".into(), paused, StatusCode::CREATED, Some("action:core.echo".into()));
    let again = change(&api, &admin, (Method::PUT, pause, Some(json!({"reason": "r2"}))), "pause again", &[]).await;
    expect("pause again".into(), again, StatusCode::OK, Some("action:core.echo".into()));
    let resumed = change(&api, &admin, (Method::DELETE, pause, None), "resume", &[]).await;
    expect("resume".into(), resumed, StatusCode::OK, Some("action:core.echo".into()));

    let schedule =
        json!({"name": "nightly", "action_ref": "core.echo", "parameters": {"message": "hi"}, "cron": "0 0 * * *"});
    let made = change(&api, &admin, (Method::POST, "/api/v1/schedules", Some(schedule)), "schedule", &[]).await;
    expect("schedule".into(), made, StatusCode::CREATED, Some("schedule:nightly".into()));
    let changed =
        json!({"name": "nightly", "action_ref": "core.echo", "parameters": {"message": "ho"}, "cron": "0 1 * * *"});
    let replaced =
        change(&api, &admin, (Method::PUT, "/api/v1/schedules/nightly", Some(changed)), "schedule change", &[]).await;
    expect("schedule change".into(), replaced, StatusCode::OK, Some("schedule:nightly".into()));
    let ran = change(&api, &admin, (Method::POST, "/api/v1/schedules/nightly/run", None), "schedule run", &[]).await;
    let target = Some(format!("execution:{}", ran.1["id"]));
    // a first attempt of the schedule's action with its parameters, recorded as the schedule's
    let execution = &ran.1;
    assert_eq!(
        (execution["action_ref"].as_str(), &execution["parameters"]),
        (Some("core.echo"), &json!({"message": "ho"}))
    );
    assert_eq!((execution["status"].as_str(), execution["retry_count"].as_i64()), (Some("requested"), Some(0)));
    assert!(execution["schedule"].is_i64() && execution["scheduled_for"].is_string(), "{execution}");
    assert_eq!(execution["config"]["schedule"], "nightly");
    assert_eq!(execution["config"]["run_now"], true);
    assert!(execution["config"]["scheduled_for"].is_string(), "{execution}");
    expect("schedule run".into(), ran, StatusCode::CREATED, target);
    for (what, method, path) in [
        ("schedule pause", Method::POST, "/api/v1/schedules/nightly/pause"),
        ("schedule resume", Method::POST, "/api/v1/schedules/nightly/resume"),
        ("schedule delete", Method::DELETE, "/api/v1/schedules/nightly"),
    ] {
        let changed = change(&api, &admin, (method, path, None), what, &[]).await;
        expect(what.into(), changed, StatusCode::OK, None);
    }

    // every route that changes state was called (a new one must be added here)
    let mut routes: Vec<String> = sqlx::query_scalar("SELECT DISTINCT method || ' ' || route FROM audit_event")
        .fetch_all(&api.db.pool)
        .await
        .unwrap();
    routes.sort();
    let mut changing: Vec<String> =
        REQUIRED.iter().filter(|(method, _, _)| *method != Method::GET).map(|(m, p, _)| format!("{m} {p}")).collect();
    changing.sort();
    assert_eq!(routes, changing);
    // one row per request, each with its answer and what it made
    let rows = events(&api, &admin, "limit=1000").await;
    assert_eq!(rows.len(), sent.len(), "{rows:#?}");
    for (reason, status, target) in &sent {
        let mine: Vec<_> = rows.iter().filter(|row| row["reason"] == json!(reason)).collect();
        assert_eq!(mine.len(), 1, "{reason}: {mine:?}");
        assert_eq!(mine[0]["status"], json!(status.as_u16()), "{reason}: {}", mine[0]);
        assert_eq!(mine[0]["target"].as_str(), target.as_deref(), "{reason}: {}", mine[0]);
        assert_eq!((mine[0]["token_name"].as_str(), mine[0]["role"].as_str()), (Some("alice"), Some("admin")));
    }
    api.stop().await;
}

/// A change reads what it changes on its own transaction (review of issue 46's audit rows): more
/// cancels at once than the API's pool has connections all answer, rather than each holding a
/// connection and waiting for a second one that the others hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_cancels_at_once_than_the_pool_has_connections_all_answer() {
    let api = Served::start(|_| {}).await;
    let (_, admin) = db::token::create_with(&api.db.pool, "alice", Role::Admin, None).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..48 {
        let body = json!({"action_ref": "core.echo", "parameters": {"message": "hi"}});
        let (status, made) = api.call_as(&admin, Method::POST, "/api/v1/executions", Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{made}");
        ids.push(made["id"].as_i64().unwrap());
    }
    let cancels = futures_util::future::join_all(ids.iter().map(|id| {
        let (api, admin) = (&api, &admin);
        async move { api.call_as(admin, Method::POST, &format!("/api/v1/executions/{id}/cancel"), None).await }
    }));
    // (a deadline on the outcome, far above what it takes: before, they waited out the pool)
    let answered = tokio::time::timeout(std::time::Duration::from_secs(20), cancels)
        .await
        .expect("48 cancels at once answered within 20 s");
    for (status, answer) in answered {
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let canceled: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE status = 'canceled'")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(canceled, 48);
}
