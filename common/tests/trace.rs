//! `attune_common::trace` in process, its spans kept by an exporter of the test's own: a span
//! made under a `traceparent` is its child, and its own `traceparent` names it.

use std::sync::{Arc, Mutex};

use attune_common::trace::{self, Kind};
use opentelemetry::trace::TracerProvider;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

#[derive(Debug, Clone, Default)]
struct Kept(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Kept {
    async fn export(&self, batch: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

#[test]
fn a_span_under_a_traceparent_is_its_child_and_passes_its_own_on() {
    let kept = Kept::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(kept.clone()).build();
    assert!(trace::span("before", Kind::Internal, None, None).traceparent().is_none(), "off: no span");
    trace::turn_on(provider.tracer("attune"));
    let client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut parent = trace::span("schedule", Kind::Internal, Some(7), Some(client));
    parent.attribute("attune.worker_id", 3);
    let parent_context = parent.traceparent().expect("a traced span has a traceparent");
    let mut child = trace::span("dispatch", Kind::Producer, Some(7), Some(&parent_context));
    child.link(client);
    let child_context = child.traceparent().expect("and so has its child");
    assert!(parent_context.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{parent_context}");
    assert!(child_context.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{child_context}");
    assert_ne!(parent_context, child_context);
    // a malformed parent: a root of a trace of its own
    let root = trace::span("run", Kind::Consumer, Some(8), Some("00-bad"));
    assert!(!root.traceparent().unwrap().contains("4bf92f3577b34da6a3ce929d0e0e4736"));
    drop((child, parent, root));

    let spans = kept.0.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["dispatch", "schedule", "run"]);
    let (dispatch, schedule) = (&spans[0], &spans[1]);
    assert_eq!(schedule.parent_span_id.to_string(), "00f067aa0ba902b7");
    assert_eq!(dispatch.parent_span_id, schedule.span_context.span_id());
    assert_eq!(dispatch.span_context.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(dispatch.span_kind, opentelemetry::trace::SpanKind::Producer);
    assert_eq!(dispatch.links.links.len(), 1);
    assert!(schedule.attributes.iter().any(|a| a.key.as_str() == "attune.worker_id"), "{:?}", schedule.attributes);
    assert!(schedule.attributes.iter().any(|a| a.key.as_str() == "attune.execution_id"), "{:?}", schedule.attributes);
}
