//! Each execution's trace (OpenTelemetry, when `telemetry::init` found an OTLP endpoint): the
//! API's `POST /executions` span, under the client's `traceparent` if it sent one, is the root;
//! an executor's `schedule` span and its `dispatch` span, the worker's `run` span and its
//! `record` span follow as children, the context travelling as a W3C `traceparent` in the
//! execution's row (`trace_parent`), in the dispatch message and in the result message. Every
//! attempt of a retry chain keeps the chain's first `trace_parent`: its spans are children of
//! the first attempt's submission, in one trace. The action gets its `run` span's context as
//! `TRACEPARENT`.
//!
//! With traces off every function here is a no-op that returns nothing: no span is made.

use opentelemetry::KeyValue;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
};

static TRACER: std::sync::OnceLock<opentelemetry_sdk::trace::SdkTracer> = std::sync::OnceLock::new();

/// Makes this process's execution spans with `tracer` (`telemetry::init`, once).
pub fn turn_on(tracer: opentelemetry_sdk::trace::SdkTracer) {
    let _ = TRACER.set(tracer);
}

/// Whether this process exports traces.
pub fn on() -> bool {
    TRACER.get().is_some()
}

/// The kinds of span of an execution's trace (OpenTelemetry's `SpanKind`).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Server,
    Producer,
    Consumer,
    Internal,
}

impl From<Kind> for SpanKind {
    fn from(kind: Kind) -> SpanKind {
        match kind {
            Kind::Server => SpanKind::Server,
            Kind::Producer => SpanKind::Producer,
            Kind::Consumer => SpanKind::Consumer,
            Kind::Internal => SpanKind::Internal,
        }
    }
}

/// A span of an execution's trace, ended (and sent) when dropped; nothing when traces are off.
#[derive(Debug, Default)]
pub struct Span(Option<opentelemetry_sdk::trace::Span>);

/// A span named `name` (of `execution_id`, when known), started now as the child of `parent` (a
/// W3C `traceparent`; none, or one that does not parse: a root). Nothing when traces are off.
pub fn span(name: &'static str, kind: Kind, execution_id: Option<i64>, parent: Option<&str>) -> Span {
    let Some(tracer) = TRACER.get() else { return Span(None) };
    let parent = match parent.and_then(parse) {
        Some(remote) => opentelemetry::Context::new().with_remote_span_context(remote),
        None => opentelemetry::Context::new(),
    };
    let attributes: Vec<KeyValue> =
        execution_id.map(|id| KeyValue::new("attune.execution_id", id)).into_iter().collect();
    let span = tracer
        .span_builder(name)
        .with_kind(kind.into())
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    Span(Some(span))
}

/// The span of an executor recording a failure no worker reported (a timeout, a dead worker, a
/// dead-lettered message, no worker for the runtime), in the execution's trace; nothing when
/// traces are off or the execution has no trace.
pub fn failure_span(
    execution_id: i64,
    trace_parent: Option<&str>,
    kind: Option<attune_core::failure::FailureKind>,
) -> Span {
    let Some(parent) = trace_parent.filter(|_| on()) else { return Span(None) };
    let mut span = span("record failure", Kind::Internal, Some(execution_id), Some(parent));
    if let Some(kind) = kind {
        span.attribute("attune.failure_kind", kind.as_str());
    }
    span
}

impl Span {
    /// Sets an attribute.
    pub fn attribute(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new(key, value));
        }
    }

    /// Links the span `traceparent` names.
    pub fn link(&mut self, traceparent: &str) {
        if let (Some(span), Some(context)) = (&mut self.0, parse(traceparent)) {
            span.add_link(context, Vec::new());
        }
    }

    /// This span as a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), for its children.
    pub fn traceparent(&self) -> Option<String> {
        let context = self.0.as_ref()?.span_context();
        context.is_valid().then(|| format(context))
    }
}

fn format(context: &SpanContext) -> String {
    format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8())
}

/// A W3C `traceparent` of version 00 (55 characters, lowercase hex, ids not all zero) as the
/// remote span context it names; `None` for anything else.
pub fn parse(traceparent: &str) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex =
        |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if parts.next().is_some() || version != "00" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    let context = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

/// Whether two valid `traceparent`s name spans of one trace.
pub fn same_trace(a: &str, b: &str) -> bool {
    matches!((parse(a), parse(b)), (Some(a), Some(b)) if a.trace_id() == b.trace_id())
}

/// `traceparent` if it is one (see `parse`), as it is to be stored and passed on.
pub fn valid(traceparent: &str) -> Option<String> {
    parse(traceparent).map(|context| format(&context))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_traceparent_of_version_00_is_taken() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(valid(good).as_deref(), Some(good));
        assert_eq!(valid(&format!(" {good} ")).as_deref(), Some(good));
        let other = "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01";
        assert!(same_trace(good, "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-00"));
        assert!(!same_trace(good, other) && !same_trace(good, "00-bad"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(valid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn with_traces_off_no_span_is_made() {
        assert!(!on());
        let span =
            span("run", Kind::Consumer, Some(7), Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_eq!(span.traceparent(), None);
    }
}
