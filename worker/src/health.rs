//! The worker's own health counters, reported in `capabilities.health` on every heartbeat.
//!
//! A failure here is a failure *of the worker*: it could not start the action (`action_not_found`:
//! a missing interpreter or entrypoint) or had to abandon it (`worker_unavailable`). An action that
//! runs and exits non-zero, reports a transient error or times out failed on its own account and
//! counts as a normal execution: otherwise one buggy action, run a few times, would make every
//! worker unhealthy, and an unhealthy worker gets no work that could ever reset its counters. The
//! executor's classification also ignores the failure rate until a worker has run enough
//! executions for it to mean something.
//!
//! The failure rate is reported over a recent window (`recent_executions`,
//! `recent_failed_executions`, over `ATTUNE_HEALTH_WINDOW_SECS`), with the time of the last
//! failure (`last_failure_at`), which the executors' probation of an unhealthy worker starts from;
//! `total_executions` and `failed_executions` stay the lifetime counts.
//!
//! `ATTUNE_WORKER_HEALTH_OVERRIDE_FILE` names a JSON file read at every heartbeat whose fields
//! (`consecutive_failures`, `total_executions`, `failed_executions`, `queue_depth`,
//! `average_execution_time_ms`) replace the counted ones: an operator can drain a worker by making
//! it report itself unhealthy, and tests force a worker's health with it.
//!
//! A worker that cannot renew its lease file (`Worker::tell_lease`) is unfit for new work: while
//! it is, it reports itself unhealthy as a drain does (its consecutive failures at least the
//! unhealthy threshold, no last failure, so no probation), and it recovers when a write lands.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use attune_core::health::{FailureRecord, HealthReport, HealthSignals, HealthThresholds, classify};
use chrono::Utc;

struct Counters {
    /// Consecutive failures, the recent window and the last failure.
    record: FailureRecord,
    total_executions: i64,
    failed_executions: i64,
    total_duration_ms: u64,
    /// Recent execution time: an exponentially weighted average (weight `RECENT_WEIGHT`).
    recent_duration_ms: Option<f64>,
}

/// The weight of the newest execution in `recent_duration_ms`.
const RECENT_WEIGHT: f64 = 0.2;

/// After an execution: its recent execution time, the class its failures give and its last
/// failure (a change in either is heartbeated early).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AfterRun {
    pub recent_duration_ms: Option<f64>,
    pub class: attune_core::health::HealthClass,
    pub last_failure_at: Option<chrono::DateTime<Utc>>,
}

pub struct HealthState {
    config: HealthThresholds,
    override_file: Option<PathBuf>,
    counters: Mutex<Counters>,
    in_flight: AtomicI64,
    /// Unfit for new work whatever the counters say (`set_unfit`).
    unfit: std::sync::atomic::AtomicBool,
}

/// Counts an execution as in flight until dropped.
pub struct InFlight<'a>(&'a AtomicI64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HealthState {
    /// `window_secs`: the window the failure rate is measured over.
    pub fn new(config: HealthThresholds, override_file: Option<PathBuf>, window_secs: i64) -> Self {
        let counters = Counters {
            record: FailureRecord::new(window_secs),
            total_executions: 0,
            failed_executions: 0,
            total_duration_ms: 0,
            recent_duration_ms: None,
        };
        HealthState {
            config,
            override_file,
            counters: Mutex::new(counters),
            in_flight: AtomicI64::new(0),
            unfit: Default::default(),
        }
    }

    /// The worker is unfit for new work (its lease file cannot be renewed), or fit again.
    pub fn set_unfit(&self, unfit: bool) {
        self.unfit.store(unfit, Ordering::SeqCst);
    }

    /// Whether the worker is unfit for new work: it reports itself unhealthy and starts nothing.
    pub fn unfit(&self) -> bool {
        self.unfit.load(Ordering::SeqCst)
    }

    fn overrides(&self) -> serde_json::Map<String, serde_json::Value> {
        let Some(path) = &self.override_file else { return Default::default() };
        let Ok(text) = std::fs::read_to_string(path) else { return Default::default() };
        match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => {
                tracing::warn!(path = %path.display(), "health override file is not a JSON object; ignored");
                Default::default()
            }
        }
    }

    pub fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.in_flight)
    }

    /// Counts a finished execution; `worker_failed` when the worker, not the action, failed.
    /// Returns what the executors schedule by, from the counters alone (no override file is read
    /// on this path: once per execution).
    pub fn finish(&self, worker_failed: bool, duration_ms: u64) -> AfterRun {
        let now = Utc::now();
        let mut c = self.counters.lock().expect("health counters poisoned");
        c.record.record(&self.config, now, worker_failed);
        c.total_executions += 1;
        c.total_duration_ms += duration_ms;
        let newest = duration_ms as f64;
        c.recent_duration_ms =
            Some(c.recent_duration_ms.map_or(newest, |recent| recent + RECENT_WEIGHT * (newest - recent)));
        c.failed_executions += i64::from(worker_failed);
        AfterRun {
            recent_duration_ms: c.recent_duration_ms,
            class: c.record.class(&self.config, now),
            last_failure_at: c.record.last_failure_at,
        }
    }

    /// The recent execution time (ms), once the worker has run anything.
    pub fn recent_duration_ms(&self) -> Option<f64> {
        self.counters.lock().expect("health counters poisoned").recent_duration_ms
    }

    pub fn report(&self) -> HealthReport {
        let now = Utc::now();
        let (record, total_executions, failed_executions, average_execution_time_ms) = {
            let c = self.counters.lock().expect("health counters poisoned");
            let average =
                if c.total_executions > 0 { (c.total_duration_ms / c.total_executions as u64) as i64 } else { 0 };
            (c.record.clone(), c.total_executions, c.failed_executions, average)
        };
        let (recent_executions, recent_failed_executions) = record.recent(now);
        let overrides = self.overrides();
        let field =
            |name: &str, counted: i64| overrides.get(name).and_then(serde_json::Value::as_i64).unwrap_or(counted);
        let total_executions = field("total_executions", total_executions);
        let failed_executions = field("failed_executions", failed_executions);
        // an override of the lifetime counts (the tests' way of forcing a rate) stands for the
        // window too
        let recent = |name: &str, lifetime: &str, counted: i64, overridden: i64| {
            overrides.get(name).and_then(serde_json::Value::as_i64).unwrap_or(if overrides.contains_key(lifetime) {
                overridden
            } else {
                counted
            })
        };
        let recent_executions = recent("recent_executions", "total_executions", recent_executions, total_executions);
        let recent_failed_executions =
            recent("recent_failed_executions", "failed_executions", recent_failed_executions, failed_executions);
        // a forced failure count (an operator's drain) is not a failure to recover from: no
        // probation for it
        let forced = ["consecutive_failures", "failed_executions", "recent_failed_executions"]
            .iter()
            .any(|field| overrides.contains_key(*field));
        let unfit = self.unfit();
        let last_failure_at = record.last_failure_at.filter(|_| !forced && !unfit);
        let consecutive_failures = field("consecutive_failures", record.consecutive_failures);
        let signals = HealthSignals {
            last_heartbeat: Some(now),
            consecutive_failures: match unfit {
                true => consecutive_failures.max(self.config.unhealthy_threshold),
                false => consecutive_failures,
            },
            total_executions: recent_executions,
            failed_executions: recent_failed_executions,
            queue_depth: field("queue_depth", self.in_flight.load(Ordering::Relaxed)),
            last_failure_at,
        };
        HealthReport {
            status: Some(classify(&self.config, &signals, now)),
            last_check: Some(now),
            consecutive_failures: signals.consecutive_failures,
            total_executions,
            failed_executions,
            average_execution_time_ms: field("average_execution_time_ms", average_execution_time_ms),
            queue_depth: signals.queue_depth,
            recent_executions: Some(recent_executions),
            recent_failed_executions: Some(recent_failed_executions),
            window_secs: Some(record.window_secs()),
            last_failure_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_core::health::HealthClass;

    #[test]
    fn counters_follow_outcomes() {
        let state = HealthState::new(HealthThresholds::default(), None, 600);
        for _ in 0..3 {
            state.finish(true, 10);
        }
        let report = state.report();
        assert_eq!((report.consecutive_failures, report.failed_executions, report.total_executions), (3, 3, 3));
        assert_eq!(report.status, Some(HealthClass::Degraded));
        state.finish(false, 30);
        let report = state.report();
        assert_eq!(report.consecutive_failures, 0);
        assert_eq!(report.average_execution_time_ms, 15);
        let guard = state.start();
        assert_eq!(state.report().queue_depth, 1);
        drop(guard);
        assert_eq!(state.report().queue_depth, 0);
    }
}

#[cfg(test)]
mod override_tests {
    use super::*;
    use attune_core::health::HealthClass;

    #[test]
    fn the_override_file_replaces_counted_fields_and_can_be_removed() {
        let path = std::env::temp_dir().join(format!("attune-health-override-{}", std::process::id()));
        let state = HealthState::new(HealthThresholds::default(), Some(path.clone()), 600);
        assert_eq!(state.report().status, Some(HealthClass::Healthy));
        std::fs::write(&path, r#"{"consecutive_failures": 10, "queue_depth": 7}"#).unwrap();
        let report = state.report();
        assert_eq!(
            (report.status, report.consecutive_failures, report.queue_depth),
            (Some(HealthClass::Unhealthy), 10, 7)
        );
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(state.report().status, Some(HealthClass::Healthy));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(state.report().consecutive_failures, 0);
    }

    #[test]
    fn an_unfit_worker_reports_itself_unhealthy_without_probation_until_fit_again() {
        let state = HealthState::new(HealthThresholds::default(), None, 600);
        state.finish(true, 10);
        state.set_unfit(true);
        let report = state.report();
        assert_eq!(report.status, Some(HealthClass::Unhealthy));
        assert_eq!((report.consecutive_failures, report.last_failure_at), (10, None));
        state.set_unfit(false);
        let report = state.report();
        assert_eq!((report.status, report.consecutive_failures), (Some(HealthClass::Healthy), 1));
        assert!(report.last_failure_at.is_some());
    }
}
