//! Worker health: what a worker reports on every heartbeat, and the one classification of it.
//!
//! A worker's class is the worst class any single signal gives (heartbeat age, consecutive
//! failures, queue depth, failure rate). A stale or missing heartbeat makes a worker unhealthy
//! whatever it reported. The failure rate only counts once a worker has run
//! `failure_rate_min_executions` executions (default 10): one failure out of one is not evidence
//! that a fresh worker is broken. The SQL function `worker_health_class` mirrors this exactly.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthClass {
    Healthy,
    Degraded,
    Unhealthy,
}

impl HealthClass {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthClass::Healthy => "healthy",
            HealthClass::Degraded => "degraded",
            HealthClass::Unhealthy => "unhealthy",
        }
    }
}

/// The `capabilities.health` object a worker reports (the seed's fields, exactly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct HealthReport {
    pub status: Option<HealthClass>,
    pub last_check: Option<DateTime<Utc>>,
    #[serde(default)]
    pub consecutive_failures: i64,
    #[serde(default)]
    pub total_executions: i64,
    #[serde(default)]
    pub failed_executions: i64,
    #[serde(default)]
    pub average_execution_time_ms: i64,
    #[serde(default)]
    pub queue_depth: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthProbeConfig {
    pub enabled: bool,
    pub heartbeat_max_age_secs: i64,
    pub degraded_threshold: i64,
    pub unhealthy_threshold: i64,
    pub queue_depth_degraded: i64,
    pub queue_depth_unhealthy: i64,
    pub failure_rate_degraded: f64,
    pub failure_rate_unhealthy: f64,
    pub failure_rate_min_executions: i64,
}

impl Default for HealthProbeConfig {
    fn default() -> Self {
        HealthProbeConfig {
            enabled: true,
            heartbeat_max_age_secs: 30,
            degraded_threshold: 3,
            unhealthy_threshold: 10,
            queue_depth_degraded: 50,
            queue_depth_unhealthy: 100,
            failure_rate_degraded: 0.3,
            failure_rate_unhealthy: 0.7,
            failure_rate_min_executions: 10,
        }
    }
}

/// What the classification looks at for one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthSignals {
    pub last_heartbeat: Option<DateTime<Utc>>,
    pub consecutive_failures: i64,
    pub total_executions: i64,
    pub failed_executions: i64,
    /// Executions dispatched to the worker and not yet finished (or what the worker reported, if
    /// more).
    pub queue_depth: i64,
}

/// The class of one worker; every worker is healthy while the probe is disabled.
pub fn classify(config: &HealthProbeConfig, signals: &HealthSignals, now: DateTime<Utc>) -> HealthClass {
    if !config.enabled {
        return HealthClass::Healthy;
    }
    let heartbeat_fresh =
        signals.last_heartbeat.is_some_and(|at| (now - at).num_milliseconds() < config.heartbeat_max_age_secs * 1000);
    if !heartbeat_fresh {
        return HealthClass::Unhealthy;
    }
    let failure_rate = (signals.total_executions >= config.failure_rate_min_executions && signals.total_executions > 0)
        .then(|| signals.failed_executions as f64 / signals.total_executions as f64);
    let by_failures = grade(signals.consecutive_failures, config.degraded_threshold, config.unhealthy_threshold);
    let by_queue = grade(signals.queue_depth, config.queue_depth_degraded, config.queue_depth_unhealthy);
    let by_rate = match failure_rate {
        Some(rate) if rate >= config.failure_rate_unhealthy => HealthClass::Unhealthy,
        Some(rate) if rate >= config.failure_rate_degraded => HealthClass::Degraded,
        _ => HealthClass::Healthy,
    };
    by_failures.max(by_queue).max(by_rate)
}

fn grade(value: i64, degraded_at: i64, unhealthy_at: i64) -> HealthClass {
    if value >= unhealthy_at {
        HealthClass::Unhealthy
    } else if value >= degraded_at {
        HealthClass::Degraded
    } else {
        HealthClass::Healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-02-09T12:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn healthy() -> HealthSignals {
        HealthSignals {
            last_heartbeat: Some(now() - Duration::seconds(1)),
            consecutive_failures: 0,
            total_executions: 0,
            failed_executions: 0,
            queue_depth: 0,
        }
    }

    #[test]
    fn thresholds_at_every_boundary() {
        use HealthClass::*;
        let c = HealthProbeConfig::default();
        let cases: Vec<(&str, HealthSignals, HealthClass)> = vec![
            ("fresh", healthy(), Healthy),
            ("2 failures", HealthSignals { consecutive_failures: 2, ..healthy() }, Healthy),
            ("3 failures", HealthSignals { consecutive_failures: 3, ..healthy() }, Degraded),
            ("9 failures", HealthSignals { consecutive_failures: 9, ..healthy() }, Degraded),
            ("10 failures", HealthSignals { consecutive_failures: 10, ..healthy() }, Unhealthy),
            ("queue 49", HealthSignals { queue_depth: 49, ..healthy() }, Healthy),
            ("queue 50", HealthSignals { queue_depth: 50, ..healthy() }, Degraded),
            ("queue 99", HealthSignals { queue_depth: 99, ..healthy() }, Degraded),
            ("queue 100", HealthSignals { queue_depth: 100, ..healthy() }, Unhealthy),
            ("rate 0.29", HealthSignals { total_executions: 100, failed_executions: 29, ..healthy() }, Healthy),
            ("rate 0.30", HealthSignals { total_executions: 100, failed_executions: 30, ..healthy() }, Degraded),
            ("rate 0.69", HealthSignals { total_executions: 100, failed_executions: 69, ..healthy() }, Degraded),
            ("rate 0.70", HealthSignals { total_executions: 100, failed_executions: 70, ..healthy() }, Unhealthy),
            (
                "rate 1/1 too few to judge",
                HealthSignals { total_executions: 1, failed_executions: 1, ..healthy() },
                Healthy,
            ),
            (
                "rate 9/9 too few to judge",
                HealthSignals { total_executions: 9, failed_executions: 9, ..healthy() },
                Healthy,
            ),
            (
                "rate 10/10 judged",
                HealthSignals { total_executions: 10, failed_executions: 10, ..healthy() },
                Unhealthy,
            ),
            (
                "heartbeat 29.999 s",
                HealthSignals { last_heartbeat: Some(now() - Duration::milliseconds(29_999)), ..healthy() },
                Healthy,
            ),
            (
                "heartbeat 30 s",
                HealthSignals { last_heartbeat: Some(now() - Duration::seconds(30)), ..healthy() },
                Unhealthy,
            ),
            (
                "heartbeat 31 s",
                HealthSignals { last_heartbeat: Some(now() - Duration::seconds(31)), ..healthy() },
                Unhealthy,
            ),
            ("never heartbeated", HealthSignals { last_heartbeat: None, ..healthy() }, Unhealthy),
            ("worst signal wins", HealthSignals { consecutive_failures: 3, queue_depth: 100, ..healthy() }, Unhealthy),
        ];
        for (name, signals, expected) in cases {
            assert_eq!(classify(&c, &signals, now()), expected, "{name}");
        }
    }

    #[test]
    fn report_round_trips_the_seed_example() {
        let seed = serde_json::json!({
            "status": "healthy", "last_check": "2026-02-09T12:00:00Z", "consecutive_failures": 0,
            "total_executions": 1000, "failed_executions": 20, "average_execution_time_ms": 1500,
            "queue_depth": 5
        });
        let report: HealthReport = serde_json::from_value(seed.clone()).unwrap();
        assert_eq!(report.total_executions, 1000);
        let back = serde_json::to_value(&report).unwrap();
        assert_eq!(back["status"], "healthy");
        assert_eq!(back["queue_depth"], 5);
        assert_eq!(back.as_object().unwrap().len(), 7);
    }
}
