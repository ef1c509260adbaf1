//! OpenTelemetry traces, received over OTLP/HTTP by a collector of the test's own: one trace from
//! the client's `traceparent` through `POST /executions`, each attempt's scheduling, dispatch,
//! run and recording, across a retry (every attempt under the chain's first submission), and the
//! action's `TRACEPARENT` naming its `run` span.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attune_testkit::{System, TempPack, wait_for};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use serde_json::{Value, json};

const FLAKY: &str = r#"name: flaky
description: Shows its TRACEPARENT; fails transiently on its first attempt
runtime: shell
entrypoint: actions/flaky.sh
max_retries: 1
retry:
  backoff: fixed
  base_delay_secs: 1
  jitter: 0
  on: [transient_error]
"#;

const FLAKY_SH: &str = r#"#!/bin/sh
printf '{"traceparent": "%s"}\n' "${TRACEPARENT-}"
[ "$ATTUNE_RETRY_COUNT" -ge 1 ] || exit 75
"#;

/// A span as received: hex ids, name, kind, the service that sent it, and its attributes.
#[derive(Debug, Clone)]
struct Received {
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: i32,
    service: String,
    attributes: BTreeMap<String, String>,
}

impl Received {
    fn execution(&self) -> Option<i64> {
        self.attributes.get("attune.execution_id")?.parse().ok()
    }
}

/// An OTLP/HTTP traces endpoint (`POST /v1/traces`, protobuf) that keeps what it receives.
async fn collector() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
                let mut kept = kept.lock().unwrap();
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .map(|a| text(a.value.as_ref().and_then(|v| v.value.as_ref())))
                        .unwrap_or_default();
                    for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                        kept.push(Received {
                            trace: hex(&span.trace_id),
                            id: hex(&span.span_id),
                            parent: hex(&span.parent_span_id),
                            name: span.name,
                            kind: span.kind,
                            service: service.clone(),
                            attributes: span
                                .attributes
                                .iter()
                                .map(|a| (a.key.clone(), text(a.value.as_ref().and_then(|v| v.value.as_ref()))))
                                .collect(),
                        });
                    }
                }
                ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&any_value::Value>) -> String {
    match value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

// OpenTelemetry's span kinds, as OTLP numbers them
const INTERNAL: i32 = 1;
const SERVER: i32 = 2;
const PRODUCER: i32 = 4;
const CONSUMER: i32 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_an_execution_and_its_retry_from_the_client_to_the_recorded_result() {
    let (endpoint, spans) = collector().await;
    let pack = TempPack::new("traced", &[("flaky.yaml", FLAKY), ("flaky.sh", FLAKY_SH)]);
    let system = System::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .pack(pack.path())
        .worker("w1", &[])
        .start()
        .await;
    // the client's own trace: the submission's span is its child
    let (client_trace, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let response = system
        .http
        .post(format!("{}/api/v1/executions", system.api_url))
        .bearer_auth(&system.token)
        .header("traceparent", format!("00-{client_trace}-{client_span}-01"))
        .json(&json!({"action_ref": "traced.flaky"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let first: Value = response.json().await.unwrap();
    let first_id = first["id"].as_i64().unwrap();
    let chain = system.wait_chain(first_id, Duration::from_secs(60)).await;
    let statuses: Vec<&str> = chain.iter().map(|a| a["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["failed", "completed"], "{chain:?}");
    let retry_id = chain[1]["id"].as_i64().unwrap();

    // every span of both attempts: the submission, and per attempt schedule, dispatch, run,
    // record; the executor's recording of the failure
    let expected = 1 + 2 * 4 + 1;
    let all = spans.clone();
    let shown = move || {
        let all = all.lock().unwrap();
        let lines: Vec<String> = all
            .iter()
            .map(|s| format!("{} {}/{}<-{} #{:?} {}", s.service, s.trace, s.id, s.parent, s.execution(), s.name))
            .collect();
        lines.join("\n")
    };
    let received = wait_for("the spans of both attempts", Duration::from_secs(60), || {
        let spans = spans.lock().unwrap().clone();
        let ours: Vec<Received> = spans.into_iter().filter(|s| s.trace == client_trace).collect();
        async move { (ours.len() >= expected).then_some(ours) }
    });
    let received = match tokio::time::timeout(Duration::from_secs(30), received).await {
        Ok(received) => received,
        Err(_) => panic!("the spans received: {}", shown()),
    };
    let one = |name: &str, execution: i64| -> Received {
        let found: Vec<&Received> =
            received.iter().filter(|s| s.name == name && s.execution() == Some(execution)).collect();
        assert_eq!(found.len(), 1, "one '{name}' span of #{execution} in {received:#?}");
        found[0].clone()
    };
    let submit = one("POST /executions", first_id);
    assert_eq!((submit.parent.as_str(), submit.kind, submit.service.as_str()), (client_span, SERVER, "attune-api"));
    // the row names the submission's span, for every attempt of the chain
    let traceparent = format!("00-{client_trace}-{}-01", submit.id);
    assert_eq!(first["trace_parent"], json!(traceparent), "{first}");
    let (_, retry) = system.get(&format!("/api/v1/executions/{retry_id}")).await;
    assert_eq!(retry["trace_parent"], json!(traceparent), "{retry}");

    for (attempt, execution) in [first_id, retry_id].into_iter().enumerate() {
        let schedule = one("schedule", execution);
        let dispatch = one("dispatch", execution);
        let run = one("run", execution);
        let record = one("record", execution);
        assert_eq!(schedule.parent, submit.id, "attempt {attempt}: scheduled under the chain's first submission");
        assert_eq!(schedule.attributes.get("attune.retry_count"), Some(&attempt.to_string()));
        assert_eq!((dispatch.parent.as_str(), dispatch.kind), (schedule.id.as_str(), PRODUCER), "attempt {attempt}");
        assert_eq!((run.parent.as_str(), run.kind), (dispatch.id.as_str(), CONSUMER), "attempt {attempt}");
        assert_eq!(record.parent, run.id, "attempt {attempt}");
        assert_eq!((schedule.kind, schedule.service.as_str()), (INTERNAL, "attune-executor"));
        assert_eq!(dispatch.service, "attune-executor");
        assert_eq!((run.service.as_str(), record.service.as_str()), ("attune-worker", "attune-worker"));
        // the action ran with its run span's context
        let (_, view) = system.get(&format!("/api/v1/executions/{execution}")).await;
        assert_eq!(view["result"]["traceparent"], json!(format!("00-{client_trace}-{}-01", run.id)), "{view}");
    }
    // the failure was recorded by an executor, under the worker's `record` span
    let recorded = one("record result", first_id);
    assert_eq!(
        (recorded.parent.as_str(), recorded.kind, recorded.service.as_str()),
        (one("record", first_id).id.as_str(), CONSUMER, "attune-executor")
    );
    system.stop().await;
}
