//! TLS as users meet it, with the real binaries: the CLI over `https://` and a worker over
//! `amqps://`, each through a TLS-terminating proxy (the API and RabbitMQ speak plain TCP here)
//! that serves a certificate of a CA made for the test. Trusted through `ATTUNE_CA_CERT` and
//! `ATTUNE_AMQP_CA_CERT`, refused with a clear error without them.

use std::process::{Output, Stdio};
use std::time::Duration;

use attune_testkit::tls::{TestCertificates, TlsProxy, upstream_of};
use attune_testkit::{System, amqp_url, wait_for};
use serde_json::{Value, json};

/// The `attune` CLI against `api_url` with this system's token and no CA setting but `ca`.
fn attune(system: &System, api_url: &str, ca: Option<&str>, args: &[&str]) -> Output {
    let mut command = system.command("attune");
    command.args(args).env("ATTUNE_API_URL", api_url).env("ATTUNE_TOKEN", &system.token).env_remove("ATTUNE_CA_CERT");
    if let Some(ca) = ca {
        command.env("ATTUNE_CA_CERT", ca);
    }
    command.output().expect("run attune")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_speaks_https_trusting_a_private_ca_and_refuses_an_unknown_one() {
    let system = System::builder().worker("w1", &[]).start().await;
    let certificates = TestCertificates::make();
    let proxy = TlsProxy::start(&certificates, upstream_of(&system.api_url, 80)).await;
    let ca = certificates.ca.display().to_string();

    // By name and by address (the certificate names both), a run and a listing over https.
    let by_name = format!("https://localhost:{}", proxy.port);
    let out = attune(&system, &by_name, Some(&ca), &["run", "core.echo", "message=tls", "--wait", "--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let execution: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!((execution["status"].as_str(), execution["stdout"].as_str()), (Some("completed"), Some("tls\n")));
    let by_address = format!("https://127.0.0.1:{}", proxy.port);
    let out = attune(&system, &by_address, Some(&ca), &["execution", "list", "--output", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(page["total"], 1, "{page}");
    assert!(proxy.handshakes() >= 2, "the requests went through the proxy");

    // The system's roots alone do not trust the test CA: a clear error, exit 1.
    let out = attune(&system, &by_name, None, &["execution", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let error = stderr(&out);
    assert!(error.contains("certificate was refused") && error.contains("ATTUNE_CA_CERT"), "{error}");
    assert!(error.contains("UnknownIssuer"), "{error}");
    wait_for("the proxy to see the refused handshake", Duration::from_secs(10), || async {
        (proxy.failed_handshakes() >= 1).then_some(())
    })
    .await;

    // A CA file that is not there is named with its setting.
    let out = attune(&system, &by_name, Some("/nonexistent/ca.pem"), &["execution", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let error = stderr(&out);
    assert!(error.contains("ATTUNE_CA_CERT") && error.contains("/nonexistent/ca.pem"), "{error}");

    system.stop().await;
}

/// `url` (an `amqp://` URL) with scheme `amqps` and `localhost:<port>` as its authority.
fn amqps_via(url: &str, port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let user = authority.rsplit_once('@').map_or(String::new(), |(user, _)| format!("{user}@"));
    format!("amqps://{user}localhost:{port}{path}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_consumes_and_publishes_over_amqps_and_stops_on_an_untrusted_broker() {
    let certificates = TestCertificates::make();
    let proxy = TlsProxy::start(&certificates, upstream_of(&amqp_url(), 5672)).await;
    let amqps = amqps_via(&amqp_url(), proxy.port);
    let ca = certificates.ca.display().to_string();
    // the worker alone goes through the proxy; the API and the executor use the plain port
    let system =
        System::builder().worker("tls-worker", &[("AMQP_URL", &amqps), ("ATTUNE_AMQP_CA_CERT", &ca)]).start().await;
    assert!(proxy.handshakes() >= 1, "the worker connected through the proxy");

    // A success (the dispatch consumed over amqps) and a failure (its result published over amqps
    // to the executor, which records it).
    let echo = system.submit("core.echo", json!({"message": "over amqps"})).await;
    let done = system.wait_terminal(echo["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!((done["status"].as_str(), done["stdout"].as_str()), (Some("completed"), Some("over amqps\n")));
    let fail = system.submit("core.fail", json!({"exit_code": 4})).await;
    let failed = system.wait_terminal(fail["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!((failed["status"].as_str(), failed["exit_code"].as_i64()), (Some("failed"), Some(4)), "{failed}");

    // Without the CA the system's roots do not trust the broker's certificate: a worker stops at
    // start, saying so.
    let refused_before = proxy.failed_handshakes();
    let mut worker = tokio::process::Command::from(system.command("attune-worker"));
    worker
        .env("AMQP_URL", &amqps)
        .env_remove("ATTUNE_AMQP_CA_CERT")
        .env("ATTUNE_WORKER_NAME", "untrusting-worker")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = worker.spawn().expect("start attune-worker");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the worker stops within 60 s")
        .unwrap();
    assert!(!out.status.success());
    let error = stderr(&out);
    assert!(error.contains("certificate was refused") && error.contains("ATTUNE_AMQP_CA_CERT"), "{error}");
    wait_for("the proxy to see the refused handshake", Duration::from_secs(10), || async {
        (proxy.failed_handshakes() > refused_before).then_some(())
    })
    .await;

    system.stop().await;
}
