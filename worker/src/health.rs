//! The worker's own health counters, reported in `capabilities.health` on every heartbeat.
//!
//! Every execution that did not complete counts as a failure (the seed's counters make no
//! distinction); the executor's classification ignores the failure rate until a worker has run
//! enough executions for it to mean something.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use attune_common::health::{HealthProbeConfig, HealthReport, HealthSignals, classify};
use chrono::Utc;

#[derive(Default)]
struct Counters {
    consecutive_failures: i64,
    total_executions: i64,
    failed_executions: i64,
    total_duration_ms: u64,
}

pub struct HealthState {
    config: HealthProbeConfig,
    counters: Mutex<Counters>,
    in_flight: AtomicI64,
}

/// Counts an execution as in flight until dropped.
pub struct InFlight<'a>(&'a AtomicI64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HealthState {
    pub fn new(config: HealthProbeConfig) -> Self {
        HealthState {
            config,
            counters: Mutex::default(),
            in_flight: AtomicI64::new(0),
        }
    }

    pub fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.in_flight)
    }

    pub fn finish(&self, succeeded: bool, duration_ms: u64) {
        let mut c = self.counters.lock().expect("health counters poisoned");
        c.total_executions += 1;
        c.total_duration_ms += duration_ms;
        if succeeded {
            c.consecutive_failures = 0;
        } else {
            c.consecutive_failures += 1;
            c.failed_executions += 1;
        }
    }

    pub fn report(&self) -> HealthReport {
        let c = self.counters.lock().expect("health counters poisoned");
        let now = Utc::now();
        let queue_depth = self.in_flight.load(Ordering::Relaxed);
        let signals = HealthSignals {
            last_heartbeat: Some(now),
            consecutive_failures: c.consecutive_failures,
            total_executions: c.total_executions,
            failed_executions: c.failed_executions,
            queue_depth,
        };
        HealthReport {
            status: Some(classify(&self.config, &signals, now)),
            last_check: Some(now),
            consecutive_failures: c.consecutive_failures,
            total_executions: c.total_executions,
            failed_executions: c.failed_executions,
            average_execution_time_ms: if c.total_executions > 0 {
                (c.total_duration_ms / c.total_executions as u64) as i64
            } else {
                0
            },
            queue_depth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_common::health::HealthClass;

    #[test]
    fn counters_follow_outcomes() {
        let state = HealthState::new(HealthProbeConfig::default());
        for _ in 0..3 {
            state.finish(false, 10);
        }
        let report = state.report();
        assert_eq!(
            (
                report.consecutive_failures,
                report.failed_executions,
                report.total_executions
            ),
            (3, 3, 3)
        );
        assert_eq!(report.status, Some(HealthClass::Degraded));
        state.finish(true, 30);
        let report = state.report();
        assert_eq!(report.consecutive_failures, 0);
        assert_eq!(report.average_execution_time_ms, 15);
        let guard = state.start();
        assert_eq!(state.report().queue_depth, 1);
        drop(guard);
        assert_eq!(state.report().queue_depth, 0);
    }
}
