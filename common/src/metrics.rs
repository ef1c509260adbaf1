//! Metrics: every metric's name, help and labels are defined here, in one place, and rendered in
//! the Prometheus text format. Labels take bounded values only (statuses, failure kinds, action
//! refs, worker names — never execution ids).
//!
//! Each process keeps its own registry (`attune up` runs every service in one process, so they
//! share one). The API serves it at `/metrics` together with gauges read from the database; the
//! executor and workers serve theirs on `ATTUNE_METRICS_ADDR` when it is set.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{LazyLock, Mutex};

/// A metric's definition.
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Histogram,
}

pub const EXECUTIONS_FINISHED: Metric = Metric {
    name: "attune_executions_finished_total",
    help: "Executions that reached a terminal state, by status and action.",
    kind: Kind::Counter,
};
pub const FAILURES: Metric = Metric {
    name: "attune_failures_total",
    help: "Failed attempts the executors recorded (retried or not), by failure kind (queue_timeout, timeout, transient_error, ...).",
    kind: Kind::Counter,
};
pub const RETRIES_CREATED: Metric = Metric {
    name: "attune_retries_total",
    help: "Retry executions created, by reason (manual_retry for operators' retries).",
    kind: Kind::Counter,
};
pub const RETRIES_FINISHED: Metric = Metric {
    name: "attune_retries_finished_total",
    help: "Retry executions that finished, by result (succeeded or failed).",
    kind: Kind::Counter,
};
pub const SCHEDULED_RUNS: Metric = Metric {
    name: "attune_scheduled_runs_total",
    help: "Executions the executors created for due schedules.",
    kind: Kind::Counter,
};
pub const SCHEDULED_MISSED: Metric = Metric {
    name: "attune_scheduled_missed_total",
    help: "Scheduled occurrences older than the grace (60 s) when looked at: skipped, or run once for all (catch_up).",
    kind: Kind::Counter,
};
pub const DISPATCH_LATENCY: Metric = Metric {
    name: "attune_dispatch_latency_seconds",
    help: "Time from an execution being requested (or its retry coming due) to its dispatch to a worker.",
    kind: Kind::Histogram,
};
pub const EXECUTION_DURATION: Metric = Metric {
    name: "attune_execution_duration_seconds",
    help: "Run time of actions on workers, by result status.",
    kind: Kind::Histogram,
};
pub const DEAD_LETTERS: Metric = Metric {
    name: "attune_dead_letters_total",
    help: "Dead letters handled by the executor, by reason (expired, delivery_limit, rejected, ...).",
    kind: Kind::Counter,
};
pub const POISON_MESSAGES: Metric = Metric {
    name: "attune_poison_messages_total",
    help: "Executions failed because their message hit the delivery limit.",
    kind: Kind::Counter,
};
pub const PARKED_MESSAGES: Metric = Metric {
    name: "attune_parked_messages_total",
    help: "Dead letters moved to the parked queue for an operator.",
    kind: Kind::Counter,
};
pub const MONITOR_RECOVERIES: Metric = Metric {
    name: "attune_monitor_recoveries_total",
    help: "Executions the timeout monitor failed or handed back to waiting, by failure kind (handed_back for lost dispatches).",
    kind: Kind::Counter,
};
pub const WORKER_UNAVAILABLE: Metric = Metric {
    name: "attune_scheduling_no_worker_total",
    help: "Scheduling attempts that found no eligible worker, by runtime.",
    kind: Kind::Counter,
};
pub const DISPATCHES: Metric = Metric {
    name: "attune_dispatches_total",
    help: "Dispatches an executor published to a worker (more than one per execution only when work went back to waiting).",
    kind: Kind::Counter,
};
pub const INFLIGHT_READS: Metric = Metric {
    name: "attune_scheduler_inflight_reads_total",
    help: "Reads of the executions in flight per worker by a scheduler, one per look that could not use its last read.",
    kind: Kind::Counter,
};
pub const HANDED_BACK: Metric = Metric {
    name: "attune_handed_back_total",
    help: "Executions that went back to waiting without having started, with no retry spent, by who handed them back (executor: the dispatch could not be sent; worker: it was stopping; monitor: the dispatch was lost).",
    kind: Kind::Counter,
};

pub const ACTIONS_RUN: Metric = Metric {
    name: "attune_worker_actions_total",
    help: "Actions a worker ran, by runtime and result status.",
    kind: Kind::Counter,
};

pub const BROKER_PUBLISHES: Metric = Metric {
    name: "attune_broker_publishes_total",
    help: "Messages published and confirmed by the broker (one round trip each).",
    kind: Kind::Counter,
};
pub const DATABASE_HOST_MOVES: Metric = Metric {
    name: "attune_database_host_moves_total",
    help: "Times a pool moved to another host of a multi-host DATABASE_URL (its host lost or no longer taking writes: a switchover or failover), by the host moved to.",
    kind: Kind::Counter,
};
pub const BROKER_DELIVERIES: Metric = Metric {
    name: "attune_broker_deliveries_total",
    help: "Messages received from the broker and settled (ack, requeue or dead-letter), by queue kind.",
    kind: Kind::Counter,
};
pub const SETTING_MISMATCHES: Metric = Metric {
    name: "attune_setting_mismatches_total",
    help: "Services heard from whose setting differs from this one's where they must agree (ATTUNE_HEARTBEAT_MAX_AGE_SECS), by setting.",
    kind: Kind::Counter,
};
pub const LIVE_OUTPUT_DROPPED: Metric = Metric {
    name: "attune_api_live_output_dropped_total",
    help: "Live output messages a stream dropped: their user_id was not the broker user of the worker the execution runs on.",
    kind: Kind::Counter,
};
pub const LEASE_HOLDS: Metric = Metric {
    name: "attune_worker_lease_holds_total",
    help: "Times a worker's runs went on past its lease because no executor could take it for dead (every executor cut off from the database too).",
    kind: Kind::Counter,
};

/// Gauges the API reads from the database at every scrape (the record, across all processes).
pub struct Gauge {
    pub name: &'static str,
    pub help: &'static str,
}
pub const EXECUTIONS_BY_STATUS: Gauge = Gauge {
    name: "attune_executions",
    help: "Executions not finished yet (waiting, delayed, scheduled or running), by status and action; finished ones are counted by attune_executions_finished_total.",
};
pub const WORKERS_BY_HEALTH: Gauge =
    Gauge { name: "attune_workers", help: "Active workers by health class (healthy, degraded, unhealthy)." };
pub const WORKER_QUEUE_DEPTH: Gauge = Gauge {
    name: "attune_worker_queue_depth",
    help: "Executions dispatched to an active worker and not finished (or its reported depth, if more).",
};

pub const OLDEST_WAITING: Gauge = Gauge {
    name: "attune_oldest_waiting_seconds",
    help: "Age of the oldest execution waiting to be scheduled (requested), by runtime; absent when none waits.",
};
pub const RUNTIME_WORKERS: Gauge = Gauge {
    name: "attune_runtime_workers",
    help: "Active workers offering each runtime, for every runtime a worker offers or a registered action needs (0: nobody runs it).",
};

pub const OLDEST_EVENT_WAITING: Gauge = Gauge {
    name: "attune_oldest_event_waiting_seconds",
    help: "Age of the oldest event attune raised (attune.execution.exhausted, ...) that no API has answered yet; 0 when none waits.",
};

pub const ACTION_CIRCUIT_STATE: Gauge = Gauge {
    name: "attune_action_circuit_state",
    help: "Each action's circuit breaker (every one its pack declares, and every one evaluated): 0 closed, 1 open, 2 half-open.",
};

/// Renders one gauge with its samples.
pub fn render_gauge(out: &mut String, gauge: &Gauge, samples: &[(Vec<(&'static str, String)>, f64)]) {
    let _ = writeln!(out, "# HELP {} {}\n# TYPE {} gauge", gauge.name, gauge.help, gauge.name);
    for (labels, value) in samples {
        let _ = writeln!(out, "{}{} {value}", gauge.name, label_text(labels, None));
    }
}

/// Upper bounds (seconds) of the histogram buckets: 1 ms to 5 min.
pub const BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// A series: the metric's name and its label pairs.
type Series = (&'static str, Vec<(&'static str, String)>);

#[derive(Default)]
struct Registry {
    counters: BTreeMap<Series, u64>,
    histograms: BTreeMap<Series, Histogram>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
pub const EVENTS_RECEIVED: Metric = Metric {
    name: "attune_events_received_total",
    help: "Webhook deliveries recorded as events (replays included).",
    kind: Kind::Counter,
};
pub const EVENTS_DEDUPLICATED: Metric = Metric {
    name: "attune_events_deduplicated_total",
    help: "Webhook deliveries whose delivery id was recorded already (answered as before, nothing made).",
    kind: Kind::Counter,
};
pub const RULE_ANSWERS: Metric = Metric {
    name: "attune_rule_answers_total",
    help: "Rules' answers to events, by outcome: matched (an execution made), not_matched, held (cooldown or rate), error.",
    kind: Kind::Counter,
};
const ALL: [&Metric; 26] = [
    &EXECUTIONS_FINISHED,
    &FAILURES,
    &RETRIES_CREATED,
    &RETRIES_FINISHED,
    &DISPATCH_LATENCY,
    &EXECUTION_DURATION,
    &DEAD_LETTERS,
    &POISON_MESSAGES,
    &PARKED_MESSAGES,
    &MONITOR_RECOVERIES,
    &WORKER_UNAVAILABLE,
    &DISPATCHES,
    &INFLIGHT_READS,
    &HANDED_BACK,
    &ACTIONS_RUN,
    &BROKER_PUBLISHES,
    &BROKER_DELIVERIES,
    &SETTING_MISMATCHES,
    &LEASE_HOLDS,
    &LIVE_OUTPUT_DROPPED,
    &DATABASE_HOST_MOVES,
    &SCHEDULED_RUNS,
    &SCHEDULED_MISSED,
    &EVENTS_RECEIVED,
    &EVENTS_DEDUPLICATED,
    &RULE_ANSWERS,
];

fn key(metric: &Metric, labels: &[(&'static str, &str)]) -> Series {
    (metric.name, labels.iter().map(|(k, v)| (*k, v.to_string())).collect())
}

/// Adds `by` to a counter.
pub fn increment(metric: &Metric, labels: &[(&'static str, &str)], by: u64) {
    debug_assert!(metric.kind == Kind::Counter, "{} is not a counter", metric.name);
    let mut registry = REGISTRY.lock().expect("metrics registry poisoned");
    *registry.counters.entry(key(metric, labels)).or_default() += by;
}

/// Records one observation (in seconds) in a histogram.
pub fn observe(metric: &Metric, labels: &[(&'static str, &str)], seconds: f64) {
    debug_assert!(metric.kind == Kind::Histogram, "{} is not a histogram", metric.name);
    let mut registry = REGISTRY.lock().expect("metrics registry poisoned");
    let histogram = registry.histograms.entry(key(metric, labels)).or_default();
    for (i, bound) in BUCKETS.iter().enumerate() {
        if seconds <= *bound {
            histogram.counts[i] += 1;
        }
    }
    histogram.count += 1;
    histogram.sum += seconds;
}

/// The current value of a counter (for tests and stats).
pub fn counter_value(metric: &Metric, labels: &[(&'static str, &str)]) -> u64 {
    REGISTRY.lock().expect("metrics registry poisoned").counters.get(&key(metric, labels)).copied().unwrap_or(0)
}

pub fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn label_text(labels: &[(&'static str, String)], extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() { String::new() } else { format!("{{{}}}", parts.join(",")) }
}

/// This process's metrics in the Prometheus text format (every metric, with HELP and TYPE, even
/// before its first sample).
pub fn render() -> String {
    let registry = REGISTRY.lock().expect("metrics registry poisoned");
    let mut out = String::new();
    for metric in ALL {
        let kind = match metric.kind {
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {} {}\n# TYPE {} {kind}", metric.name, metric.help, metric.name);
        for ((name, labels), value) in registry.counters.iter().filter(|((n, _), _)| *n == metric.name) {
            let _ = writeln!(out, "{name}{} {value}", label_text(labels, None));
        }
        for ((name, labels), h) in registry.histograms.iter().filter(|((n, _), _)| *n == metric.name) {
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    label_text(labels, Some(("le", bound.to_string()))),
                    h.counts[i]
                );
            }
            let _ = writeln!(out, "{name}_bucket{} {}", label_text(labels, Some(("le", "+Inf".into()))), h.count);
            let _ = writeln!(out, "{name}_sum{} {}", label_text(labels, None), h.sum);
            let _ = writeln!(out, "{name}_count{} {}", label_text(labels, None), h.count);
        }
    }
    out
}

/// Serves `GET /metrics` (this process's registry) on `addr` until `shutdown` fires: a minimal
/// HTTP/1.1 responder for the executor and workers, which have no HTTP server of their own.
pub async fn serve(addr: std::net::SocketAddr, shutdown: tokio_util::sync::CancellationToken) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "metrics listening");
    loop {
        let (mut stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        tokio::spawn(async move {
            let mut request = vec![0u8; 4096];
            let n = match tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut request)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&request[..n]);
            let (status, body) = if head.starts_with("GET /metrics ") || head.starts_with("GET /metrics?") {
                ("200 OK", render())
            } else {
                ("404 Not Found", "only GET /metrics here\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// Starts [`serve`] in the background when `ATTUNE_METRICS_ADDR` is set; a bind failure is logged,
/// not fatal.
pub fn serve_from_env(shutdown: tokio_util::sync::CancellationToken) {
    let Some(addr) = crate::settings::read_optional(&crate::settings::Environment, "ATTUNE_METRICS_ADDR") else {
        return;
    };
    match addr.trim().parse::<std::net::SocketAddr>() {
        Ok(addr) => {
            tokio::spawn(async move {
                if let Err(e) = serve(addr, shutdown).await {
                    tracing::warn!(%addr, error = %e, "metrics endpoint not available");
                }
            });
        }
        Err(e) => {
            tracing::warn!(value = %addr, error = %e, "ATTUNE_METRICS_ADDR is not an address; no metrics endpoint")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_in_prometheus_text() {
        increment(&DEAD_LETTERS, &[("reason", "expired")], 2);
        observe(&EXECUTION_DURATION, &[("status", "completed")], 0.003);
        let text = render();
        assert!(text.contains("# TYPE attune_dead_letters_total counter"));
        assert!(text.contains("attune_dead_letters_total{reason=\"expired\"} 2"), "{text}");
        assert!(text.contains("attune_execution_duration_seconds_bucket{status=\"completed\",le=\"0.0025\"} 0"));
        assert!(text.contains("attune_execution_duration_seconds_bucket{status=\"completed\",le=\"0.005\"} 1"));
        assert!(text.contains("attune_execution_duration_seconds_count{status=\"completed\"} 1"));
        for metric in ALL {
            assert!(text.contains(&format!("# HELP {} ", metric.name)), "{}", metric.name);
        }
        assert_eq!(escape("a\"b\\"), "a\\\"b\\\\");
    }
}
