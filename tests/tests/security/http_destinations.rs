//! Where an http action may not go, with the real binaries (issue 32): by default a worker refuses
//! loopback, private and other non-global destinations, by address literal or by a name that
//! resolves to one, before it connects: the answer is the same for an open and a closed port, and
//! the server hears nothing. `ATTUNE_WORKER_HTTP_ALLOW` lets chosen networks through; an entry that
//! is not a CIDR stops the worker at start.

use std::time::Duration;

use attune_testkit::http_server::{HttpServer, Reply};
use attune_testkit::{System, TempPack};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

/// A GET of `/secret` on `host` (written in the pack), the port a parameter. Retries would be
/// fast: a refusal must need none.
fn action(name: &str, host: &str) -> String {
    format!(
        "name: {name}\nruntime: http\ntimeout_seconds: 10\nmax_retries: 2\n\
         retry: {{base_delay_secs: 0.2, jitter: 0}}\n\
         parameters:\n  port:\n    type: integer\n    required: true\n\
         http:\n  url: \"http://{host}:{{{{ port }}}}/secret\"\n"
    )
}

fn pack() -> TempPack {
    TempPack::new(
        "dest",
        &[("literal.yaml", &action("literal", "127.0.0.1")), ("named.yaml", &action("named", "localhost"))],
    )
}

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// The one attempt of the chain of `action` run with `port`: a refusal is not retried.
async fn only_attempt(system: &System, action: &str, port: u16) -> Value {
    let submitted = system.submit(action, json!({"port": port})).await;
    let chain = system.wait_chain(id(&submitted), DEADLINE).await;
    assert_eq!(chain.len(), 1, "{action} on port {port}: {chain:#?}");
    chain.into_iter().next().unwrap()
}

fn refusal(attempt: &Value) -> (Option<&str>, Option<&str>, &Value, &Value) {
    (attempt["status"].as_str(), attempt["failure_kind"].as_str(), &attempt["http_status"], &attempt["result"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_is_refused_by_default_the_same_for_an_open_and_a_closed_port() {
    let server = HttpServer::start().await;
    server.script("/secret", [Reply::status(200).body("the loopback-only secret")]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let pack = pack();
    let system = System::builder().worker("w1", &[]).pack(pack.path()).start().await;

    let open = only_attempt(&system, "dest.literal", server.port()).await;
    let shut = only_attempt(&system, "dest.literal", closed).await;
    for attempt in [&open, &shut] {
        assert_eq!(refusal(attempt), (Some("failed"), Some("action_failed"), &Value::Null, &Value::Null), "{attempt}");
    }
    let error = open["error"].as_str().unwrap();
    assert_eq!(shut["error"], error, "an open and a closed port answer alike");
    assert!(error.contains("127.0.0.1") && error.contains("ATTUNE_WORKER_HTTP_ALLOW"), "{error}");
    assert!(!error.contains(&server.port().to_string()), "nothing about the destination but its host: {error}");

    // a name that resolves to loopback is refused as well
    let named = only_attempt(&system, "dest.named", server.port()).await;
    assert_eq!(refusal(&named), (Some("failed"), Some("action_failed"), &Value::Null, &Value::Null), "{named}");
    let error = named["error"].as_str().unwrap();
    assert!(error.contains("localhost") && error.contains("ATTUNE_WORKER_HTTP_ALLOW"), "{error}");

    assert!(server.requests().is_empty(), "the server heard nothing: {:?}", server.requests());
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allow_list_lets_actions_reach_loopback_and_a_bad_entry_stops_the_worker() {
    let server = HttpServer::start().await;
    server.script("/secret", [Reply::status(200).body("allowed")]);
    let pack = pack();
    let system = System::builder()
        .env("ATTUNE_WORKER_HTTP_ALLOW", "10.0.0.0/8, 127.0.0.1/32")
        .worker("w1", &[])
        .pack(pack.path())
        .start()
        .await;
    for action in ["dest.literal", "dest.named"] {
        let done = only_attempt(&system, action, server.port()).await;
        assert_eq!((done["status"].as_str(), done["result"]["body"].as_str()), (Some("completed"), Some("allowed")));
    }
    assert_eq!(server.requests_to("/secret").len(), 2);

    // an entry that is not a CIDR: the worker does not start, and says which setting and entry
    let mut command = tokio::process::Command::from(system.command("attune-worker"));
    command.env("ATTUNE_WORKER_HTTP_ALLOW", "127.0.0.1/32,10.0.0.0/33").env("ATTUNE_WORKER_NAME", "bad-allow");
    let output = tokio::time::timeout(DEADLINE, command.kill_on_drop(true).output()).await.unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("ATTUNE_WORKER_HTTP_ALLOW") && stderr.contains("10.0.0.0/33"), "{stderr}");
    system.stop().await;
}
