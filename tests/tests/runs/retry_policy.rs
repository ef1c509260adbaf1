//! The retry policy beyond the seeds, end to end with the real binaries: `retry.rules` decide by
//! exit code and by a value in the result, and each decision is recorded with its rule;
//! `max_retries: -1` retries without end, capped in delay, until a cancel stops it; a circuit
//! breaker keeps a failing action's executions away from what it calls.

use std::time::Duration;

use attune_testkit::{System, TempPack, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// Exits with `codes[ATTUNE_RETRY_COUNT]` (the last one after that), printing `result` as JSON on
/// the way when given.
const EXITS: &str = r#"#!/bin/sh
set -- $ATTUNE_PARAM_CODES
shift "$(( ATTUNE_RETRY_COUNT < $# ? ATTUNE_RETRY_COUNT : $# - 1 ))"
[ -n "$ATTUNE_PARAM_RESULT" ] && printf '%s\n' "$ATTUNE_PARAM_RESULT"
exit "$1"
"#;

const RULED: &str = r#"name: ruled
runtime: shell
entrypoint: actions/exits.sh
max_retries: 1
parameters:
  codes: {type: string, required: true}
  result: {type: string, default: ""}
retry:
  base_delay_secs: 0.2
  jitter: 0
  rules:
    - when: {exit_codes: [3], failure_kinds: [timeout]}
      then: {do: retry, attempts: 3, backoff: fixed, delay_secs: 0.3}
    - when: {exit_codes: [4]}
      then: {do: fail}
    - when: {result: {path: error.code, in: [busy]}}
      then: {do: retry, attempts: 2, delay_secs: 0.1}
"#;

const FOREVER: &str = r#"name: forever
runtime: shell
entrypoint: actions/exits.sh
max_retries: -1
parameters:
  codes: {type: string, default: "75"}
retry:
  base_delay_secs: 0.1
  max_delay_secs: 0.3
  jitter: 0
"#;

async fn system(pack: &TempPack) -> System {
    System::builder().worker("w1", &[]).pack(pack.path()).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_decide_by_exit_code_and_result_and_each_decision_names_its_rule() {
    let pack = TempPack::new("policy", &[("ruled.yaml", RULED), ("exits.sh", EXITS)]);
    let system = system(&pack).await;

    // exit 3 is action_failed, not retried by kind, but rule 0 retries it: 3 attempts in all,
    // past max_retries 1, at its fixed 0.3 s
    let first = system.submit("policy.ruled", json!({"codes": "3 3 3 3"})).await;
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.len(), 3, "{chain:#?}");
    for (n, attempt) in chain.iter().enumerate() {
        assert_eq!((attempt["failure_kind"].as_str(), attempt["exit_code"].as_i64()), (Some("action_failed"), Some(3)));
        let decision = &attempt["retry_decision"];
        assert_eq!(decision["matched_rule"], 0, "{decision}");
        assert_eq!(decision["retried"], n < 2, "{decision}");
        if n > 0 {
            let backoff = attempt["backoff_secs"].as_f64().unwrap();
            assert!((0.29..=0.35).contains(&backoff), "the rule's fixed delay: {backoff}");
        }
    }
    assert_eq!(chain[2]["retry_decision"]["rule"], "exhausted");
    assert!(chain[2]["retry_decision"]["reason"].as_str().unwrap().contains("retry.rules[0] allows 3 attempts"));

    // exit 75 (transient) then 4: the first is retried by kind (no rule), the second fails by rule 1
    let first = system.submit("policy.ruled", json!({"codes": "75 4"})).await;
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.len(), 2, "{chain:#?}");
    assert_eq!(chain[0]["retry_decision"]["matched_rule"], Value::Null);
    assert_eq!(chain[0]["retry_decision"]["rule"], "retried");
    assert_eq!(
        (chain[1]["retry_decision"]["rule"].as_str(), chain[1]["retry_decision"]["matched_rule"].as_i64()),
        (Some("rule_says_fail"), Some(1))
    );

    // a value in the result: {"error": {"code": "busy"}} is retried by rule 2, twice in all
    let first =
        system.submit("policy.ruled", json!({"codes": "1", "result": "{\"error\": {\"code\": \"busy\"}}"})).await;
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.len(), 2, "{chain:#?}");
    assert_eq!(chain[0]["result"], json!({"error": {"code": "busy"}}));
    assert_eq!(chain[0]["retry_decision"]["matched_rule"], 2);
    // and the SQL function agrees with each recorded decision
    for attempt in &chain {
        let retriable: bool = sqlx::query_scalar(
            "SELECT is_execution_retriable($1) OR EXISTS (SELECT 1 FROM execution WHERE original_execution = $1)",
        )
        .bind(id(attempt))
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
        assert_eq!(retriable, attempt["retry_decision"]["retried"] == true, "{attempt}");
    }
    // the CLI tells the decision with its rule
    let told = system.cli(&["execution", "explain", &chain[0]["id"].to_string()]);
    assert!(told.contains("matched: retry.rules[2]"), "{told}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_retries_go_on_capped_in_delay_until_a_cancel_stops_them() {
    let pack = TempPack::new("policy", &[("forever.yaml", FOREVER), ("exits.sh", EXITS)]);
    let system = system(&pack).await;
    let first = system.submit("policy.forever", json!({})).await;
    assert_eq!(first["max_retries"], -1);
    // past any ordinary budget
    let waiting = wait_for("the 8th attempt to wait for its turn", DEADLINE, || async {
        let (_, chain) = system.get(&format!("/api/v1/executions/{}/chain", id(&first))).await;
        let attempts = chain["attempts"].as_array()?.clone();
        let last = attempts.last()?.clone();
        (attempts.len() >= 8 && last["status"] == "delayed").then_some((attempts, last))
    })
    .await;
    let (attempts, last) = waiting;
    for attempt in &attempts[1..] {
        let backoff = attempt["backoff_secs"].as_f64().unwrap();
        assert!(backoff <= 0.3 + 0.01, "capped at max_delay_secs: {backoff}");
    }
    assert!(attempts[..attempts.len() - 1].iter().all(|a| a["retry_decision"]["retried"] == true));
    // a cancel of the waiting retry ends the chain
    let (status, canceled) = system.post(&format!("/api/v1/executions/{}/cancel", id(&last)), &json!({})).await;
    assert_eq!((status, canceled["status"].as_str()), (200, Some("canceled")), "{canceled}");
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.last().unwrap()["id"], last["id"]);
    assert_eq!(chain.last().unwrap()["status"], "canceled");
    // nothing is left to run or wait for the action
    let alive: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM execution WHERE action_ref = 'policy.forever' \
         AND status NOT IN ('completed', 'failed', 'timeout', 'canceled', 'abandoned')",
    )
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(alive, 0);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_with_max_attempts_zero_registers_with_a_warning_and_its_first_attempt_runs() {
    let zero = "name: zero\nruntime: shell\nentrypoint: actions/exits.sh\nparameters:\n  codes: {type: string, default: \"75\"}\nretry:\n  max_attempts: 0\n";
    let system = System::builder().worker("w1", &[]).start().await;
    // written where the operator puts packs, after the API started
    let pack = TempPack::new("policy", &[("zero.yaml", zero), ("exits.sh", EXITS)]);
    let dir = system.packs_dir().join("policy");
    attune_testkit::copy_dir(pack.path(), &dir);
    let told = system.cli(&["pack", "register", dir.to_str().unwrap()]);
    assert!(told.starts_with("registered pack policy 1.0.0 (1 actions)"), "{told}");
    assert!(told.contains("warning: ") && told.contains("zero.yaml: field 'retry.max_attempts'"), "{told}");
    // the first attempt runs (and fails, transiently), and nothing after it
    let first = system.submit("policy.zero", json!({})).await;
    let chain = system.wait_chain(id(&first), DEADLINE).await;
    assert_eq!(chain.len(), 1, "{chain:#?}");
    assert_eq!((chain[0]["status"].as_str(), chain[0]["exit_code"].as_i64()), (Some("failed"), Some(75)));
    assert_eq!(chain[0]["retry_decision"]["rule"], "exhausted");
    system.stop().await;
}

/// An http action calling a dependency that always fails, guarded by a circuit.
const GUARDED: &str = r#"name: guarded
runtime: http
max_retries: 3
parameters:
  port: {type: integer, required: true}
http:
  url: "http://127.0.0.1:{{ port }}/dependency"
retry:
  base_delay_secs: 0.2
  jitter: 0
  circuit: {failure_rate: 0.5, window_secs: 60, min_executions: 5, open_secs: 2}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_keeps_fifty_submissions_and_their_retries_away_from_a_failing_dependency() {
    use attune_testkit::http_server::{HttpServer, Reply};
    async fn circuit(system: &System) -> Value {
        system.get("/api/v1/actions/policy.guarded").await.1["circuit"].clone()
    }
    let server = HttpServer::start().await;
    server.script("/dependency", [Reply::status(503)]);
    let pack = TempPack::new("policy", &[("guarded.yaml", GUARDED)]);
    let system = System::builder().allow_http_to_loopback().worker("w1", &[]).pack(pack.path()).start().await;
    let (_, worker) = system.get("/api/v1/workers").await;
    let slots = worker[0]["capabilities"]["slots"].as_u64().unwrap() as usize;

    let mut submitted = Vec::new();
    for _ in 0..50 {
        submitted.push(id(&system.submit("policy.guarded", json!({"port": server.port()})).await));
    }
    wait_for("the circuit to open", DEADLINE, || async {
        let c = circuit(&system).await;
        (c["state"] == "open").then_some(())
    })
    .await;
    let calls_at_open = server.requests_to("/dependency").len();
    // while open: the gauge and the dashboard say so
    let (_, metrics) = system.request(reqwest::Method::GET, "/metrics", None, None).await;
    let metrics = metrics.as_str().unwrap().to_string();
    assert!(
        metrics.contains("attune_action_circuit_state{action=\"policy.guarded\"} 1")
            || metrics.contains("attune_action_circuit_state{action=\"policy.guarded\"} 2"),
        "{metrics}"
    );
    let browser = attune_testkit::browser::Browser::start().await;
    browser.goto(&format!("{}/ui/login?next=%2Fui%2Fretries", system.api_url)).await;
    browser.type_into("#token", &system.token).await;
    browser.click("#login-submit").await;
    browser.wait("the retries page", "return location.pathname === '/ui/retries'").await;
    let badge = browser
        .wait(
            "the circuit badge",
            "const b = document.querySelector('#circuit-table [data-action=\"policy.guarded\"] [data-circuit]'); return b && b.dataset.circuit",
        )
        .await;
    assert!(badge == "open" || badge == "half_open", "{badge}");

    // three more open periods: each lets one trial through, which fails and opens it again
    wait_for("the circuit to have opened 4 times", DEADLINE, || async {
        let c = circuit(&system).await;
        (c["opened_count"].as_i64().unwrap_or(0) >= 4).then_some(())
    })
    .await;
    let calls = server.requests_to("/dependency").len();
    eprintln!(
        "circuit: {calls_at_open} calls to the dependency when it opened, {calls} after 4 open periods ({slots} slots)"
    );
    // before it opened: at most the executions that finished to open it and what was already
    // dispatched (the worker's slots); after: one trial per open period. (What was dispatched
    // before it opened may call after `calls_at_open` was read: the bound on all calls counts
    // them with the slots, not with the trials.)
    assert!(calls_at_open <= 5 + slots, "{calls_at_open} calls before the circuit opened ({slots} slots)");
    assert!(calls <= 5 + slots + 4, "{calls} calls in all, {calls_at_open} when it opened ({slots} slots)");
    // nothing was failed for it: the rest wait, and their retries were held, not spent
    let (_, page) = system.get("/api/v1/executions?action_ref=policy.guarded&limit=200&fields=full").await;
    let finished_without_retry = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == "failed" && e["retry_decision"]["retried"] != true)
        .count();
    assert_eq!(finished_without_retry, 0, "every failure so far was retried (held), none given up");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM execution WHERE action_ref = 'policy.guarded' AND status IN ('requested', 'delayed')",
    )
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert!(held >= 40, "{held} executions wait for the dependency");
    assert_eq!(submitted.len(), 50);
    system.stop().await;
}
