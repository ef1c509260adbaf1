//! Events in (issue 49, ADR 0013): a webhook's deliveries become events, and a rule's match an
//! execution, in the transaction the sender's `2xx` waits for; a redelivery makes nothing more,
//! a cooldown holds a key's repeats, and every event says what each rule made of it.

use std::time::Duration;

use attune_testkit::{System, TempPack};
use serde_json::{Value, json};

const NOTE: &str = "name: note\nruntime: shell\nentrypoint: actions/note.sh\nparameters:\n  host:\n    type: string\n    required: true\n    pattern: \"[a-z0-9.-]+\"\n  why:\n    type: string\n";
const NOTE_SH: &str = "#!/bin/sh\necho \"noted $ATTUNE_PARAM_HOST\"\n";
const ALERTS: &str = "name: alerts\nauth: token\nmax_bytes: 512\n";
const SIGNED: &str = "name: signed\nauth: github\n";
const STRIPE: &str = "name: payments\nauth: stripe\n";
const ON_ALERT: &str = "name: on_alert\ntrigger: webhook.alerts\ncriteria:\n  - \"{{ payload.severity }} == 'critical'\"\naction: hooks.note\nparameters:\n  host: \"{{ payload.host }}\"\n  why: \"{{ payload.name }} on {{ payload.host }}\"\ncooldown: {key: host, for: 10m}\n";
const ON_SIGNED: &str =
    "name: on_signed\ntrigger: webhook.signed\naction: hooks.note\nparameters: {host: \"{{ payload.host }}\"}\n";
const ON_PAYMENT: &str = "name: on_payment\ntrigger: webhook.payments\naction: hooks.note\nparameters: {host: \"{{ payload.data.host }}\"}\n";

fn hooks_pack() -> TempPack {
    TempPack::new("hooks", &[("note.yaml", NOTE), ("note.sh", NOTE_SH)])
        .file("webhooks/alerts.yaml", ALERTS)
        .file("webhooks/signed.yaml", SIGNED)
        .file("webhooks/payments.yaml", STRIPE)
        .file("rules/on_alert.yaml", ON_ALERT)
        .file("rules/on_signed.yaml", ON_SIGNED)
        .file("rules/on_payment.yaml", ON_PAYMENT)
}

/// A delivery to `name` with `headers`; its status and answer.
async fn deliver(system: &System, name: &str, body: &str, headers: &[(&str, String)]) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/api/v1/webhooks/{name}", system.api_url))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (header, value) in headers {
        request = request.header(*header, value);
    }
    let response = request.send().await.expect("delivery");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn signature(key: &str, signed: &[u8]) -> String {
    hex(ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes()), signed).as_ref())
}

async fn rule_executions(system: &System, rule: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT execution FROM event_match WHERE rule = $1 AND execution IS NOT NULL ORDER BY execution")
        .bind(rule)
        .fetch_all(&system.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_runs_its_rule_once_however_often_it_is_sent_and_a_cooldown_holds_repeats() {
    let pack = hooks_pack();
    let system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    let alert =
        |severity: &str, host: &str| json!({"severity": severity, "host": host, "name": "disk full"}).to_string();

    // no credential yet: nothing is taken
    let (status, body) = deliver(&system, "alerts", &alert("critical", "h1"), &[]).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("attune webhook credential alerts"), "{body}");
    let (status, set) = system
        .request(reqwest::Method::PUT, "/api/v1/webhooks/alerts/credential", Some(&json!({})), Some(&system.token))
        .await;
    assert_eq!(status, 200, "{set}");
    let token = set["token"].as_str().unwrap().to_string();
    let (status, listed) = system.get("/api/v1/webhooks").await;
    assert_eq!(status, 200);
    assert!(listed.to_string().contains("credential_set") && !listed.to_string().contains(&token), "{listed}");

    // the sender proves itself with the webhook's token, not an API token
    for headers in [
        vec![],
        vec![("x-attune-webhook-token", "wrong".to_string())],
        vec![("authorization", format!("Bearer {}", system.token))],
    ] {
        let (status, body) = deliver(&system, "alerts", &alert("critical", "h1"), &headers).await;
        assert_eq!(status, 401, "{headers:?}: {body}");
    }
    let with =
        |delivery: &str| vec![("x-attune-webhook-token", token.clone()), ("x-delivery-id", delivery.to_string())];
    let (status, first) = deliver(&system, "alerts", &alert("critical", "h1"), &with("d-1")).await;
    assert_eq!(status, 202, "{first}");
    let made = first["matches"][0]["execution"].as_i64().unwrap_or_else(|| panic!("{first}"));
    // a redelivery: answered as the first was, nothing more made
    let (status, again) = deliver(&system, "alerts", &alert("critical", "h1"), &with("d-1")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (again["duplicate"].as_bool(), &again["event"], &again["matches"]),
        (Some(true), &first["event"], &first["matches"])
    );
    let ran = system.wait_terminal(made, Duration::from_secs(30)).await;
    assert_eq!(ran["status"], "completed", "{ran}");
    assert_eq!(ran["parameters"], json!({"host": "h1", "why": "disk full on h1"}));
    assert_eq!((ran["config"]["rule"].as_str(), &ran["config"]["event"]), (Some("hooks.on_alert"), &first["event"]));

    // a criterion that does not hold is the event's record of why nothing ran
    let (status, warning) = deliver(&system, "alerts", &alert("warning", "h1"), &with("d-2")).await;
    assert_eq!(status, 202, "{warning}");
    assert_eq!(warning["matches"][0]["matched"], false);
    assert!(warning["matches"][0]["reason"].as_str().unwrap().starts_with("criteria.0 is false"), "{warning}");
    // so is a parameter the action refuses
    let (_, refused) = deliver(&system, "alerts", &alert("critical", "BAD HOST"), &with("d-3")).await;
    assert!(refused["matches"][0]["reason"].as_str().unwrap().contains("parameter 'host'"), "{refused}");

    // 40 alerts for 2 more hosts at once under a 10-minute cooldown per host: 2 executions
    let sends = (0..40).map(|n| {
        let (system, headers) = (&system, with(&format!("burst-{n}")));
        async move { deliver(system, "alerts", &alert("critical", &format!("h{}", 2 + n % 2)), &headers).await }
    });
    let answers = futures_util::future::join_all(sends).await;
    assert!(answers.iter().all(|(status, _)| *status == 202), "{answers:?}");
    let held = answers
        .iter()
        .filter(|(_, a)| a["matches"][0]["reason"].as_str().is_some_and(|r| r.contains("cooldown of 'h")))
        .count();
    assert_eq!(held, 38, "{answers:?}");
    assert_eq!(rule_executions(&system, "hooks.on_alert").await.len(), 3, "h1, h2 and h3 once each");
    // h1 too is cooling down
    let (_, h1) = deliver(&system, "alerts", &alert("critical", "h1"), &with("d-4")).await;
    assert!(h1["matches"][0]["reason"].as_str().unwrap().contains("cooldown of 'h1'"), "{h1}");

    // the metrics count the same answers
    let metrics = reqwest::get(format!("{}/metrics", system.api_url)).await.unwrap().text().await.unwrap();
    for line in [
        "attune_events_deduplicated_total 1",
        "attune_rule_answers_total{outcome=\"matched\"} 3",
        "attune_rule_answers_total{outcome=\"held\"} 39",
        "attune_rule_answers_total{outcome=\"not_matched\"} 1",
        "attune_rule_answers_total{outcome=\"error\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in:\n{metrics}");
    }

    // what the webhook does not take
    let (status, body) = deliver(&system, "alerts", &"x".repeat(600), &with("d-5")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (413, Some("body_too_large")), "{body}");
    let (status, body) = deliver(&system, "alerts", "{not json", &with("d-6")).await;
    assert_eq!((status, body["error"]["parameter"].as_str()), (400, Some("body")), "{body}");
    let (status, _) = deliver(&system, "nope", "{}", &with("d-7")).await;
    assert_eq!(status, 404);

    // the record: events newest first with their matches; a replay is an event of its own
    let (status, events) = system.get("/api/v1/events?trigger=webhook.alerts&limit=3").await;
    assert_eq!(status, 200, "{events}");
    assert_eq!(events.as_array().unwrap().len(), 3);
    let warning_event = warning["event"].as_i64().unwrap();
    let (status, shown) = system.get(&format!("/api/v1/events/{warning_event}")).await;
    assert_eq!((status, &shown["delivery"], &shown["matches"]), (200, &json!("d-2"), &warning["matches"]), "{shown}");
    let (status, replayed) = system.post(&format!("/api/v1/events/{warning_event}/replay"), &json!({})).await;
    assert_eq!(status, 202, "{replayed}");
    let (_, replay) = system.get(&format!("/api/v1/events/{}", replayed["event"])).await;
    assert_eq!(
        (replay["replay_of"].as_i64(), &replay["payload"]),
        (Some(warning_event), &shown["payload"]),
        "{replay}"
    );
    let (status, rules) = system.get("/api/v1/rules").await;
    assert_eq!(status, 200, "{rules}");
    let on_alert = rules.as_array().unwrap().iter().find(|r| r["ref"] == "hooks.on_alert").expect("listed");
    assert_eq!(on_alert["trigger"], "webhook.alerts", "{on_alert}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_takes_only_what_its_key_signed() {
    let pack = hooks_pack();
    let system = System::builder().pack(pack.path()).secrets_key().worker("w1", &[]).start().await;
    let key = "a-shared-signing-key-of-github";
    let put = |name: &str, value: Value| {
        let system = &system;
        let path = format!("/api/v1/webhooks/{name}/credential");
        async move { system.request(reqwest::Method::PUT, &path, Some(&value), Some(&system.token)).await }
    };
    let (status, body) = put("signed", json!({})).await;
    assert_eq!((status, body["error"]["parameter"].as_str()), (422, Some("value")), "a key is needed: {body}");
    let (status, body) = put("signed", json!({"value": key})).await;
    assert_eq!((status, &body["token"]), (200, &Value::Null), "{body}");

    let payload = json!({"host": "gh1"}).to_string();
    let good = format!("sha256={}", signature(key, payload.as_bytes()));
    let bad = format!("sha256={}", signature("another-key-entirely-here", payload.as_bytes()));
    let (status, body) = deliver(&system, "signed", &payload, &[("x-hub-signature-256", bad)]).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) =
        deliver(&system, "signed", &(payload.clone() + " "), &[("x-hub-signature-256", good.clone())]).await;
    assert_eq!(status, 401, "a body changed in flight: {body}");
    let headers = [("x-hub-signature-256", good), ("x-github-delivery", "gh-77".to_string())];
    let (status, body) = deliver(&system, "signed", &payload, &headers).await;
    assert_eq!(status, 202, "{body}");
    let (status, again) = deliver(&system, "signed", &payload, &headers).await;
    assert_eq!((status, again["duplicate"].as_bool()), (200, Some(true)), "GitHub's delivery id: {again}");
    assert_eq!(rule_executions(&system, "hooks.on_signed").await.len(), 1);

    // Stripe: the time and the body signed together, the event's id its delivery
    let stripe_key = "whsec_a-stripe-signing-secret";
    put("payments", json!({"value": stripe_key})).await;
    let event = json!({"id": "evt_1", "data": {"host": "pay1"}}).to_string();
    let now = chrono::Utc::now().timestamp();
    let signed = |at: i64| format!("t={at},v1={}", signature(stripe_key, format!("{at}.{event}").as_bytes()));
    let (status, body) = deliver(&system, "payments", &event, &[("stripe-signature", signed(now - 3600))]).await;
    assert_eq!(status, 401, "an old signature: {body}");
    let (status, body) = deliver(&system, "payments", &event, &[("stripe-signature", signed(now))]).await;
    assert_eq!(status, 202, "{body}");
    let (status, again) = deliver(&system, "payments", &event, &[("stripe-signature", signed(now))]).await;
    assert_eq!((status, again["duplicate"].as_bool()), (200, Some(true)), "{again}");
    let made = body["matches"][0]["execution"].as_i64().unwrap();
    assert_eq!(system.wait_terminal(made, Duration::from_secs(30)).await["parameters"]["host"], "pay1");
    system.stop().await;
}

const BOOM: &str = "name: boom\nruntime: shell\nentrypoint: actions/boom.sh\nmax_retries: 1\nretry: {base_delay_secs: 0.2, jitter: 0}\nparameters:\n  code:\n    type: integer\n    default: 75\n  after:\n    type: integer\n    default: 0\n";
const BOOM_SH: &str =
    "#!/bin/sh\nsleep \"$ATTUNE_PARAM_AFTER\"\necho \"boom $ATTUNE_PARAM_CODE\" >&2\nexit \"$ATTUNE_PARAM_CODE\"\n";
const NOTIFY_RULE: &str = "name: NAME\ntrigger: attune.execution.exhausted\ncriteria:\n  - \"{{ payload.execution.action }} == 'alarm.boom'\"\n  - \"{{ payload.execution.failure_kind }} == 'KIND'\"\naction: core.notify_webhook\nparameters:\n  url: \"URL\"\n  signing_key: {$secret: alarm_key}\n  delivery: \"alarm-{{ event.id }}\"\n  body:\n    execution: \"{{ payload.execution.id }}\"\n    status: \"{{ payload.execution.status }}\"\n    attempts: \"{{ payload.execution.retry_count }}\"\n    why: \"{{ payload.execution.decision }}\"\n";

/// The execution rule `rule` made for the event attune raised about `execution`.
async fn made_for(system: &System, rule: &str, execution: i64) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT m.execution FROM event e JOIN event_match m ON m.event = e.id \
         WHERE m.rule = $1 AND (e.payload->'execution'->>'id')::bigint = $2",
    )
    .bind(rule)
    .bind(execution)
    .fetch_optional(&system.db.pool)
    .await
    .unwrap()
    .flatten()
}

fn checks_signature(key: &str, request: &attune_testkit::http_server::Recorded) {
    let signature = request.header("x-attune-signature").expect("signed");
    let (at, tag) = signature.strip_prefix("t=").and_then(|s| s.split_once(",v1=")).expect("t=…,v1=…");
    let signed = [at.as_bytes(), b".", &request.body].concat();
    assert_eq!(tag, self::signature(key, &signed), "the signature is the HMAC of TIME.BODY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_that_fails_for_good_is_notified_once_signed_and_retried_past_a_receiver_down() {
    let receiver = attune_testkit::http_server::HttpServer::start().await;
    let rule = |name: &str, kind: &str, path: &str| {
        NOTIFY_RULE.replace("NAME", name).replace("KIND", kind).replace("URL", &receiver.url(path))
    };
    let pack = TempPack::new("alarm", &[("boom.yaml", BOOM), ("boom.sh", BOOM_SH)])
        .file("rules/tell.yaml", &rule("tell", "transient_error", "/hook"))
        .file("rules/tell_down.yaml", &rule("tell_down", "action_failed", "/down"));
    let mut system = System::builder().pack(pack.path()).secrets_key().worker("w1", &[]).start().await;
    let key = "a-receiver's-signing-key";
    let (status, body) = system
        .request(
            reqwest::Method::PUT,
            "/api/v1/secrets/alarm_key",
            Some(&json!({"value": key, "users": ["core.notify_webhook"]})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    receiver.script("/hook", [attune_testkit::http_server::Reply::status(204)]);

    // a transient failure is retried once, then the chain is exhausted: one notification, for
    // the last attempt only
    let first = system.submit("alarm.boom", json!({})).await["id"].as_i64().unwrap();
    let chain = system.wait_chain(first, Duration::from_secs(30)).await;
    assert_eq!(chain.len(), 2, "{chain:?}");
    let last = &chain[1];
    assert_eq!(last["status"], "failed", "{last}");
    let last_id = last["id"].as_i64().unwrap();
    let notify = attune_testkit::wait_for("the notification's execution", Duration::from_secs(10), || async {
        made_for(&system, "alarm.tell", last_id).await
    })
    .await;
    let done = system.wait_terminal(notify, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(made_for(&system, "alarm.tell", first).await, None, "the retried attempt is not exhausted");
    let got = receiver.requests_to("/hook");
    assert_eq!(got.len(), 1, "one notification");
    checks_signature(key, &got[0]);
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(sent["execution"], last_id, "{sent}");
    assert_eq!((sent["status"].as_str(), sent["attempts"].as_i64()), (Some("failed"), Some(1)), "{sent}");
    assert!(sent["why"].as_str().unwrap().contains("retries"), "{sent}");
    // received within a second of the failure: the notification had finished by then
    let took: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM n.finished - f.finished)::float8 FROM execution n, execution f \
         WHERE n.id = $1 AND f.id = $2",
    )
    .bind(notify)
    .bind(last_id)
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    eprintln!("the notification finished {took:.3} s after the failure");
    assert!(took < 1.0, "the notification took {took:.3} s after the failure");
    // the notification's own execution raised no event: nothing notifies of a notification
    let about_notify: i64 =
        sqlx::query_scalar("SELECT count(*) FROM event WHERE (payload->'execution'->>'id')::bigint = $1")
            .bind(notify)
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
    assert_eq!(about_notify, 0);

    // the receiver down (503 twice): the notification is retried with the same delivery id,
    // and other work runs meanwhile
    receiver.script(
        "/down",
        [
            attune_testkit::http_server::Reply::status(503),
            attune_testkit::http_server::Reply::status(503),
            attune_testkit::http_server::Reply::status(200),
        ],
    );
    let failing = system.submit("alarm.boom", json!({"code": 1})).await["id"].as_i64().unwrap();
    assert_eq!(system.wait_terminal(failing, Duration::from_secs(30)).await["status"], "failed");
    let notify = attune_testkit::wait_for("the second notification", Duration::from_secs(10), || async {
        made_for(&system, "alarm.tell_down", failing).await
    })
    .await;
    receiver.wait_requests("/down", 1, Duration::from_secs(10)).await;
    let echo = system.submit("core.echo", json!({"message": "meanwhile"})).await["id"].as_i64().unwrap();
    assert_eq!(system.wait_terminal(echo, Duration::from_secs(10)).await["status"], "completed");
    let tries = system.wait_chain(notify, Duration::from_secs(60)).await;
    assert_eq!(tries.len(), 3, "{tries:?}");
    assert_eq!(tries[2]["status"], "completed", "{tries:?}");
    assert_eq!(tries[0]["failure_kind"], "transient_error", "{tries:?}");
    let got = receiver.requests_to("/down");
    assert_eq!(got.len(), 3);
    let deliveries: std::collections::BTreeSet<_> =
        got.iter().map(|r| r.header("x-attune-delivery").unwrap()).collect();
    assert_eq!(deliveries.len(), 1, "every attempt is the same delivery: {deliveries:?}");
    for request in &got {
        checks_signature(key, request);
    }
    let (status, events) = system.get("/api/v1/events?trigger=attune.execution.exhausted").await;
    assert_eq!(status, 200);
    assert_eq!(events.as_array().unwrap().len(), 2, "{events}");
    let metrics = reqwest::get(format!("{}/metrics", system.api_url)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("# TYPE attune_oldest_event_waiting_seconds gauge"), "declared");
    assert!(metrics.contains("\nattune_oldest_event_waiting_seconds 0\n"), "nothing waits: 0");

    // with no API, a failure's event waits, and the API that starts answers it
    let slow = system.submit("alarm.boom", json!({"code": 1, "after": 1})).await["id"].as_i64().unwrap();
    system.signal("api", 9);
    let waiting = attune_testkit::wait_for("the event raised with no API", Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT p.event FROM event_pending p JOIN event e ON e.id = p.event \
             WHERE (e.payload->'execution'->>'id')::bigint = $1",
        )
        .bind(slow)
        .fetch_optional(&system.db.pool)
        .await
        .unwrap()
    })
    .await;
    system.restart("api");
    system.wait_ready().await;
    let notify = attune_testkit::wait_for("the waiting event's notification", Duration::from_secs(10), || async {
        made_for(&system, "alarm.tell_down", slow).await
    })
    .await;
    assert_eq!(system.wait_chain(notify, Duration::from_secs(30)).await.last().unwrap()["status"], "completed");
    let (_, answered) = system.get(&format!("/api/v1/events/{waiting}")).await;
    assert_eq!(answered["matches"].as_array().unwrap().len(), 2, "{answered}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_make_enable_and_delete_rules_and_a_pack_s_registration_keeps_their_say() {
    let pack = hooks_pack();
    let system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    let (_, set) = system
        .request(reqwest::Method::PUT, "/api/v1/webhooks/alerts/credential", Some(&json!({})), Some(&system.token))
        .await;
    let token = set["token"].as_str().unwrap().to_string();
    let owned = system;
    let system = &owned;
    let send = |delivery: &str, host: &str| {
        let body = json!({"severity": "critical", "host": host, "name": "down"}).to_string();
        let headers = [("x-attune-webhook-token", token.clone()), ("x-delivery-id", delivery.to_string())];
        async move { deliver(system, "alerts", &body, &headers).await }
    };

    // an operator's rule, from a file written as a pack's, by the command line
    let file = pack.path().join("extra-rule.yaml");
    std::fs::write(
        &file,
        "name: page\ntrigger: webhook.alerts\naction: hooks.note\nparameters: {host: \"{{ payload.host }}\", why: paged}\n",
    )
    .unwrap();
    let made = system.cli_output(&["rule", "create", file.to_str().unwrap()]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    assert!(String::from_utf8_lossy(&made.stdout).contains("rule local.page made"), "{made:?}");
    let again = system.cli_output(&["rule", "create", file.to_str().unwrap()]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("exists"), "{again:?}");
    // a bad one names the file and the field before anything is sent
    std::fs::write(&file, "name: page2\ntrigger: webhook.alerts\naction: nodot\n").unwrap();
    let bad = system.cli_output(&["rule", "create", file.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && said.contains("extra-rule.yaml") && said.contains("action"), "{said}");
    let (status, refused) = system
        .post("/api/v1/rules", &json!({"name": "x", "trigger": "webhook.alerts", "action": "hooks.nothing"}))
        .await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("action")), "{refused}");

    let (status, answer) = send("o-1", "h1").await;
    assert_eq!(status, 202, "{answer}");
    let made: Vec<(&str, bool)> = answer["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["rule"].as_str().unwrap(), m["execution"].is_i64()))
        .collect();
    assert_eq!(made, vec![("hooks.on_alert", true), ("local.page", true)], "{answer}");

    // a pack's rule disabled by hand stays disabled when its pack is registered again
    let disabled = system.cli_output(&["rule", "disable", "hooks.on_alert"]);
    assert!(disabled.status.success(), "{}", String::from_utf8_lossy(&disabled.stderr));
    let (status, registered) =
        system.post("/api/v1/packs", &json!({"path": pack.path().file_name().unwrap().to_str()})).await;
    assert!(status < 300, "{registered}");
    let (_, rules) = system.get("/api/v1/rules").await;
    let on_alert = rules.as_array().unwrap().iter().find(|r| r["ref"] == "hooks.on_alert").unwrap();
    assert_eq!((&on_alert["enabled"], on_alert["enabled_by"].is_i64()), (&json!(false), true), "{on_alert}");
    let local = rules.as_array().unwrap().iter().find(|r| r["ref"] == "local.page").expect("still there");
    assert!(local["made_by"].is_i64(), "{local}");
    let (_, answer) = send("o-2", "h2").await;
    let rules_answering: Vec<&str> =
        answer["matches"].as_array().unwrap().iter().map(|m| m["rule"].as_str().unwrap()).collect();
    assert_eq!(rules_answering, vec!["local.page"], "a disabled rule answers nothing: {answer}");

    // a pack's rule cannot be deleted, only disabled; an operator's can
    let (status, refused) =
        system.request(reqwest::Method::DELETE, "/api/v1/rules/hooks.on_alert", None, Some(&system.token)).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("enabled"), "{refused}");
    let deleted = system.cli_output(&["rule", "delete", "local.page"]);
    assert!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
    let enabled = system.cli_output(&["rule", "enable", "hooks.on_alert"]);
    assert!(enabled.status.success(), "{}", String::from_utf8_lossy(&enabled.stderr));
    let (_, answer) = send("o-3", "h3").await;
    let rules_answering: Vec<&str> =
        answer["matches"].as_array().unwrap().iter().map(|m| m["rule"].as_str().unwrap()).collect();
    assert_eq!(rules_answering, vec!["hooks.on_alert"], "{answer}");
    // a schedule's occurrence is an event a rule answers
    let (status, made) = system
        .post(
            "/api/v1/rules",
            &json!({"name": "on_tick", "trigger": "schedule.tick", "action": "hooks.note",
                "parameters": {"host": "{{ payload.schedule.name }}", "why": "ran {{ payload.schedule.execution }}"}}),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let at = (chrono::Utc::now() + chrono::Duration::seconds(2)).to_rfc3339();
    let (status, schedule) = system
        .post(
            "/api/v1/schedules",
            &json!({"name": "tick", "action_ref": "core.echo", "parameters": {"message": "t"}, "at": at}),
        )
        .await;
    assert_eq!(status, 201, "{schedule}");
    let ticked = attune_testkit::wait_for("the schedule's event answered", Duration::from_secs(30), || async {
        let (_, events) = system.get("/api/v1/events?trigger=schedule.tick").await;
        events.as_array().and_then(|e| e.first().cloned()).filter(|e| e["matches"][0]["execution"].is_i64())
    })
    .await;
    let (_, fired) = system.get("/api/v1/schedules/tick").await;
    assert_eq!(ticked["payload"]["schedule"]["execution"], fired["last_execution"], "{ticked} {fired}");
    let note = ticked["matches"][0]["execution"].as_i64().unwrap();
    let done = system.wait_terminal(note, Duration::from_secs(30)).await;
    assert_eq!(done["parameters"]["why"], format!("ran {}", fired["last_execution"]), "{done}");

    // the first event still names the rule that answered it
    let (_, first) = system.get("/api/v1/events?trigger=webhook.alerts&limit=500").await;
    assert!(first.to_string().contains("local.page"), "{first}");
    owned.stop().await;
}

/// Sends `count` deliveries `PREFIX-N` to `alerts` from `senders` tasks at once; which were
/// answered `2xx`.
async fn stream(system: &System, token: &str, prefix: &str, ids: Vec<usize>, senders: usize) -> Vec<(usize, bool)> {
    let ids = std::sync::Arc::new(std::sync::Mutex::new(ids.into_iter()));
    let mut tasks = Vec::new();
    for _ in 0..senders {
        let (ids, url, token, prefix) = (ids.clone(), system.api_url.clone(), token.to_string(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
            let mut answered = Vec::new();
            loop {
                let Some(n) = ids.lock().unwrap().next() else { break };
                let body = json!({"severity": "critical", "host": format!("h{n}"), "name": "down"});
                let sent = http
                    .post(format!("{url}/api/v1/webhooks/alerts"))
                    .header("x-attune-webhook-token", &token)
                    .header("x-delivery-id", format!("{prefix}-{n}"))
                    .json(&body)
                    .send()
                    .await;
                answered.push((n, sent.is_ok_and(|r| r.status().is_success())));
            }
            answered
        }));
    }
    let mut answered = Vec::new();
    for task in tasks {
        answered.extend(task.await.unwrap());
    }
    answered
}

/// Each delivery `PREFIX-N` recorded, with the executions its event's rules made.
async fn recorded(system: &System, prefix: &str) -> std::collections::BTreeMap<String, Vec<i64>> {
    let rows: Vec<(String, Option<i64>)> = sqlx::query_as(
        "SELECT e.delivery, m.execution FROM event e LEFT JOIN event_match m ON m.event = e.id \
         WHERE e.trigger = 'webhook.alerts' AND e.delivery LIKE $1 || '-%'",
    )
    .bind(prefix)
    .fetch_all(&system.db.pool)
    .await
    .unwrap();
    let mut by_delivery = std::collections::BTreeMap::<String, Vec<i64>>::new();
    for (delivery, execution) in rows {
        by_delivery.entry(delivery).or_default().extend(execution);
    }
    by_delivery
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_2xx_has_its_event_across_an_api_killed_mid_stream() {
    // (the cooldown of hooks.on_alert is by host: each delivery here is a host of its own)
    let pack = hooks_pack();
    let mut system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    let (_, set) = system
        .request(reqwest::Method::PUT, "/api/v1/webhooks/alerts/credential", Some(&json!({})), Some(&system.token))
        .await;
    let token = set["token"].as_str().unwrap().to_string();
    let total = 600;

    // the stream, and the API killed while it flows
    let streaming = {
        let system_ref: &System = &system;
        let sending = stream(system_ref, &token, "k", (0..total).collect(), 8);
        let killing = async {
            attune_testkit::wait_for("a hundred deliveries", Duration::from_secs(30), || async {
                (recorded(system_ref, "k").await.len() >= 100).then_some(())
            })
            .await;
            let pid = system_ref.pid("api");
            let killed = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
            assert!(killed.success());
        };
        let (answered, ()) = tokio::join!(sending, killing);
        answered
    };
    system.restart("api");
    system.wait_ready().await;
    let refused: Vec<usize> = streaming.iter().filter(|(_, ok)| !ok).map(|(n, _)| *n).collect();
    let accepted: Vec<usize> = streaming.iter().filter(|(_, ok)| *ok).map(|(n, _)| *n).collect();
    eprintln!("{} answered 2xx, {} refused or cut off by the kill", accepted.len(), refused.len());
    assert!(!refused.is_empty() && accepted.len() >= 100, "the kill fell mid-stream: {} refused", refused.len());
    let seen = recorded(&system, "k").await;
    for n in &accepted {
        let made =
            seen.get(&format!("k-{n}")).unwrap_or_else(|| panic!("delivery k-{n} was answered 2xx, has no event"));
        assert_eq!(made.len(), 1, "k-{n}: {made:?}");
    }

    // the senders send again whatever was not answered 2xx (and some that were): each delivery
    // ends with one event and one execution
    let again: Vec<usize> = refused.iter().copied().chain(accepted.iter().copied().take(50)).collect();
    let resent = stream(&system, &token, "k", again, 4).await;
    assert!(resent.iter().all(|(_, ok)| *ok), "{resent:?}");
    let seen = recorded(&system, "k").await;
    assert_eq!(seen.len(), total, "every delivery has its event");
    let made: std::collections::BTreeSet<i64> = seen.values().flatten().copied().collect();
    assert!(seen.values().all(|m| m.len() == 1), "one execution per delivery");
    assert_eq!(made.len(), total);
    system.stop().await;
}

/// A mail server of a few lines: it takes one message over plain SMTP and hands it over.
async fn smtp_receiver() -> (u16, tokio::sync::oneshot::Receiver<(String, Vec<String>, String)>) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sent, received) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        write.write_all(b"220 test ESMTP\r\n").await.unwrap();
        let (mut from, mut to, mut data, mut in_data) = (String::new(), Vec::new(), String::new(), false);
        while let Ok(Some(line)) = lines.next_line().await {
            if in_data {
                if line == "." {
                    in_data = false;
                    write.write_all(b"250 queued\r\n").await.unwrap();
                } else {
                    data.push_str(&line);
                    data.push('\n');
                }
                continue;
            }
            let upper = line.to_ascii_uppercase();
            let reply: &[u8] = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
                b"250 test\r\n"
            } else if upper.starts_with("MAIL FROM:") {
                from = line[10..].trim().to_string();
                b"250 ok\r\n"
            } else if upper.starts_with("RCPT TO:") {
                to.push(line[8..].trim().to_string());
                b"250 ok\r\n"
            } else if upper == "DATA" {
                in_data = true;
                b"354 go on\r\n"
            } else if upper == "QUIT" {
                write.write_all(b"221 bye\r\n").await.unwrap();
                break;
            } else {
                b"250 ok\r\n"
            };
            write.write_all(reply).await.unwrap();
        }
        let _ = sent.send((from, to, data));
    });
    (port, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notify_actions_post_to_slack_and_send_mail() {
    let receiver = attune_testkit::http_server::HttpServer::start().await;
    receiver.script("/services/T/B/x", [attune_testkit::http_server::Reply::status(200).body("ok")]);
    let system = System::builder().secrets_key().worker("w1", &[]).start().await;

    // Slack's incoming webhook: {"text", "channel"}; its URL a secret parameter (sealed here)
    let slack = system
        .submit(
            "core.notify_slack",
            json!({"url": receiver.url("/services/T/B/x"), "text": "db7 is down", "channel": "#ops"}),
        )
        .await;
    assert_eq!(slack["parameters"]["url"], "[redacted]", "{slack}");
    let done = system.wait_terminal(slack["id"].as_i64().unwrap(), Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let got = receiver.requests_to("/services/T/B/x");
    assert_eq!(got.len(), 1);
    let posted: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(posted, json!({"text": "db7 is down", "channel": "#ops"}));

    // e-mail over SMTP (no STARTTLS: the test's server speaks plain)
    let (port, mail) = smtp_receiver().await;
    let email = system
        .submit(
            "core.notify_email",
            json!({"smtp_host": "127.0.0.1", "smtp_port": port, "starttls": false, "sender": "attune@example.com",
                "to": ["oncall@example.com"], "subject": "db7 is down", "text": "execution 7 failed for good"}),
        )
        .await;
    let done = system.wait_terminal(email["id"].as_i64().unwrap(), Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["sent_to"], json!(["oncall@example.com"]), "{done}");
    let (from, to, data) = tokio::time::timeout(Duration::from_secs(5), mail).await.unwrap().unwrap();
    assert_eq!((from.as_str(), to), ("<attune@example.com>", vec!["<oncall@example.com>".to_string()]));
    assert!(data.contains("Subject: db7 is down") && data.contains("execution 7 failed for good"), "{data}");
    system.stop().await;
}
