//! Worker health: what a worker reports on every heartbeat, and the one classification of it.
//!
//! A worker's class is the worst class any single signal gives (heartbeat age, consecutive
//! failures, queue depth, failure rate). A stale or missing heartbeat makes a worker unhealthy
//! whatever it reported. The failure rate only counts once a worker has run
//! `failure_rate_min_executions` executions (default 10): one failure out of one is not evidence
//! that a fresh worker is broken. The SQL function `worker_health_class` mirrors this exactly.
//!
//! Unhealthy is a state a worker leaves. Consecutive failures reset on a success. The failure
//! rate is the rate over a recent window (`recent_executions`, `recent_failed_executions`, over
//! the worker's `ATTUNE_HEALTH_WINDOW_SECS`, kept by [`FailureRecord`]), not over the worker's
//! lifetime; a worker that does not report a window is judged on its lifetime counts. And a worker
//! that is unhealthy because of its failures alone gets one probe execution at a time once its last
//! failure is `ATTUNE_HEALTH_PROBATION_SECS` old ([`on_probation`]): a success clears its record.

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
    /// Executions and failures over the recent window (`window_secs`), which the failure rate
    /// is computed from; absent from workers that count only over their lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_executions: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_failed_executions: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_secs: Option<i64>,
    /// When the worker last failed (a failure of its own), for the probation of an unhealthy one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_at: Option<DateTime<Utc>>,
}

/// The quick reference's health probe configuration, field for field: its literal compiles as
/// written.
///
/// ```
/// use attune_core::health::{HealthProbeConfig, HealthThresholds};
/// let config = HealthProbeConfig {
/// enabled: true,
/// heartbeat_max_age_secs: 30,
/// degraded_threshold: 3,
/// unhealthy_threshold: 10,
/// queue_depth_degraded: 50,
/// queue_depth_unhealthy: 100,
/// failure_rate_degraded: 0.3,
/// failure_rate_unhealthy: 0.7,
/// };
/// assert_eq!(HealthThresholds::from(config), HealthThresholds::default());
/// ```
///
/// The executor classifies with [`HealthThresholds`], which also says how many executions a
/// failure rate needs before it counts (`failure_rate_min_executions`, 10 unless set); a
/// `HealthProbeConfig` converts into it with that default.
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
}

impl From<HealthProbeConfig> for HealthThresholds {
    fn from(c: HealthProbeConfig) -> Self {
        HealthThresholds {
            enabled: c.enabled,
            heartbeat_max_age_secs: c.heartbeat_max_age_secs,
            degraded_threshold: c.degraded_threshold,
            unhealthy_threshold: c.unhealthy_threshold,
            queue_depth_degraded: c.queue_depth_degraded,
            queue_depth_unhealthy: c.queue_depth_unhealthy,
            failure_rate_degraded: c.failure_rate_degraded,
            failure_rate_unhealthy: c.failure_rate_unhealthy,
            ..HealthThresholds::default()
        }
    }
}

/// The health thresholds in force (`ATTUNE_HEALTH_*`): the quick reference's
/// [`HealthProbeConfig`] and the number of executions a failure rate needs to count.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthThresholds {
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

impl HealthThresholds {
    /// `heartbeat_max_age_secs` as a duration (at least a second).
    pub fn heartbeat_max_age(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.heartbeat_max_age_secs.max(1) as u64)
    }
}

impl Default for HealthThresholds {
    fn default() -> Self {
        HealthThresholds {
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
    /// The executions and failures the failure rate is computed from: the recent window's when
    /// the worker reports one, else its lifetime counts.
    pub total_executions: i64,
    pub failed_executions: i64,
    /// Executions dispatched to the worker and not yet finished (or what the worker reported, if
    /// more).
    pub queue_depth: i64,
    /// When the worker last failed, if it says.
    pub last_failure_at: Option<DateTime<Utc>>,
}

/// The class of one worker; every worker is healthy while the probe is disabled.
pub fn classify(config: &HealthThresholds, signals: &HealthSignals, now: DateTime<Utc>) -> HealthClass {
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

/// Whether an unhealthy worker gets one probe execution now: it is unhealthy because of its
/// failures alone (its heartbeat is fresh and its queue depth does not condemn it), it said when
/// it last failed and that was at least `probation` ago, and nothing is in flight on it.
pub fn on_probation(
    config: &HealthThresholds,
    signals: &HealthSignals,
    now: DateTime<Utc>,
    probation: chrono::Duration,
) -> bool {
    signals.queue_depth == 0
        && signals.last_failure_at.is_some_and(|at| now - at >= probation)
        && classify(config, signals, now) == HealthClass::Unhealthy
        && classify(config, &without_failures(signals), now) != HealthClass::Unhealthy
}

/// Whether a worker is unhealthy (or worse off) by its failures alone and may be probed later:
/// it would take work but for them, and it said when it last failed.
pub fn may_be_probed(config: &HealthThresholds, signals: &HealthSignals, now: DateTime<Utc>) -> bool {
    signals.last_failure_at.is_some()
        && classify(config, &HealthSignals { queue_depth: 0, ..without_failures(signals) }, now)
            != HealthClass::Unhealthy
}

fn without_failures(signals: &HealthSignals) -> HealthSignals {
    HealthSignals { consecutive_failures: 0, failed_executions: 0, ..*signals }
}

/// A worker's record of its own failures: consecutive ones (reset by a success), and the
/// outcomes of the recent window in one-tenth buckets. Pure: the caller passes the clock.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureRecord {
    window_secs: i64,
    /// `(bucket start in seconds since the epoch, executions, failures)`, oldest first.
    buckets: std::collections::VecDeque<(i64, i64, i64)>,
    pub consecutive_failures: i64,
    pub last_failure_at: Option<DateTime<Utc>>,
}

impl FailureRecord {
    pub fn new(window_secs: i64) -> Self {
        FailureRecord {
            window_secs: window_secs.max(1),
            buckets: Default::default(),
            consecutive_failures: 0,
            last_failure_at: None,
        }
    }

    pub fn window_secs(&self) -> i64 {
        self.window_secs
    }

    fn bucket_secs(&self) -> i64 {
        (self.window_secs / 10).max(1)
    }

    /// Counts one finished execution; `failed`: a failure of the worker's own. A success while
    /// the record alone would make the worker unhealthy (a probe that succeeded) clears the
    /// window: the worker has shown it works again.
    pub fn record(&mut self, config: &HealthThresholds, now: DateTime<Utc>, failed: bool) {
        if failed {
            self.consecutive_failures += 1;
            self.last_failure_at = Some(now);
        } else {
            if self.condemns(config, now) {
                self.buckets.clear();
            }
            self.consecutive_failures = 0;
        }
        self.expire(now);
        let start = now.timestamp().div_euclid(self.bucket_secs()) * self.bucket_secs();
        match self.buckets.back_mut() {
            Some((at, total, failures)) if *at == start => {
                *total += 1;
                *failures += i64::from(failed);
            }
            _ => self.buckets.push_back((start, 1, i64::from(failed))),
        }
    }

    fn expire(&mut self, now: DateTime<Utc>) {
        let oldest = now.timestamp() - self.window_secs;
        while self.buckets.front().is_some_and(|(at, _, _)| at + self.bucket_secs() <= oldest) {
            self.buckets.pop_front();
        }
    }

    /// Executions and failures within the window ending at `now`.
    pub fn recent(&self, now: DateTime<Utc>) -> (i64, i64) {
        let oldest = now.timestamp() - self.window_secs;
        self.buckets
            .iter()
            .filter(|(at, _, _)| at + self.bucket_secs() > oldest)
            .fold((0, 0), |(t, f), (_, total, failures)| (t + total, f + failures))
    }

    /// Whether the failures alone make the worker unhealthy now.
    fn condemns(&self, config: &HealthThresholds, now: DateTime<Utc>) -> bool {
        self.class(config, now) == HealthClass::Unhealthy
    }

    /// The class these failures alone give (a fresh heartbeat, nothing queued).
    pub fn class(&self, config: &HealthThresholds, now: DateTime<Utc>) -> HealthClass {
        let (total, failed) = self.recent(now);
        let signals = HealthSignals {
            last_heartbeat: Some(now),
            consecutive_failures: self.consecutive_failures,
            total_executions: total,
            failed_executions: failed,
            queue_depth: 0,
            last_failure_at: self.last_failure_at,
        };
        classify(config, &signals, now)
    }
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
            last_failure_at: None,
        }
    }

    #[test]
    fn thresholds_at_every_boundary() {
        use HealthClass::*;
        let c = HealthThresholds::default();
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
    fn the_failure_rate_counts_only_the_recent_window() {
        let c = HealthThresholds::default();
        let mut record = FailureRecord::new(600);
        let start = now();
        // 10 failures of its own, each followed by a success: never 3 in a row, rate 0.5
        for i in 0..10 {
            record.record(&c, start + Duration::seconds(i * 2), true);
            record.record(&c, start + Duration::seconds(i * 2 + 1), false);
        }
        assert_eq!(record.consecutive_failures, 0, "a success resets the consecutive failures");
        assert_eq!(record.recent(start + Duration::seconds(20)), (20, 10));
        // the window slides (by buckets of a tenth of it): once the bucket of the last of them
        // is more than ten minutes old, nothing of it counts
        assert_eq!(record.recent(start + Duration::seconds(659)), (20, 10));
        assert_eq!(record.recent(start + Duration::seconds(660)), (0, 0));
        record.record(&c, start + Duration::seconds(700), false);
        assert_eq!(record.recent(start + Duration::seconds(700)), (1, 0));
        // a bucket is dropped only once all of it is out of the window
        let mut record = FailureRecord::new(100);
        record.record(&c, start, true);
        assert_eq!(record.recent(start + Duration::seconds(99)), (1, 1));
        assert_eq!(record.recent(start + Duration::seconds(110)), (0, 0));
    }

    #[test]
    fn a_probes_success_clears_the_record_and_an_ordinary_success_does_not() {
        let c = HealthThresholds::default();
        let mut record = FailureRecord::new(600);
        for i in 0..4 {
            record.record(&c, now() + Duration::seconds(i), false);
        }
        for i in 0..10 {
            record.record(&c, now() + Duration::seconds(10 + i), true);
        }
        assert_eq!(record.recent(now() + Duration::seconds(30)), (14, 10));
        assert_eq!(record.last_failure_at, Some(now() + Duration::seconds(19)));
        // unhealthy (10 in a row, rate 10/14): the probe's success clears the window
        record.record(&c, now() + Duration::seconds(100), false);
        assert_eq!((record.consecutive_failures, record.recent(now() + Duration::seconds(100))), (0, (1, 0)));
        // degraded by its rate (3 of 10) but not unhealthy: a success keeps the window
        let mut record = FailureRecord::new(600);
        for i in 0..7 {
            record.record(&c, now() + Duration::seconds(i), false);
        }
        for i in 0..3 {
            record.record(&c, now() + Duration::seconds(10 + i), true);
        }
        record.record(&c, now() + Duration::seconds(20), false);
        assert_eq!(record.recent(now() + Duration::seconds(20)), (11, 3));
    }

    #[test]
    fn probation_comes_after_the_cool_down_to_a_worker_unhealthy_by_failures_alone() {
        let c = HealthThresholds::default();
        let probation = Duration::seconds(60);
        let failing = HealthSignals {
            consecutive_failures: 10,
            last_failure_at: Some(now() - Duration::seconds(60)),
            ..healthy()
        };
        let cases = [
            ("cooled down", failing, true),
            ("too soon", HealthSignals { last_failure_at: Some(now() - Duration::seconds(59)), ..failing }, false),
            ("no failure time (a forced report)", HealthSignals { last_failure_at: None, ..failing }, false),
            ("one probe at a time", HealthSignals { queue_depth: 1, ..failing }, false),
            (
                "by its failure rate",
                HealthSignals { consecutive_failures: 0, total_executions: 10, failed_executions: 8, ..failing },
                true,
            ),
            (
                "stale heartbeat",
                HealthSignals { last_heartbeat: Some(now() - Duration::seconds(30)), ..failing },
                false,
            ),
            ("not unhealthy", HealthSignals { consecutive_failures: 3, ..failing }, false),
        ];
        for (name, signals, expected) in cases {
            assert_eq!(on_probation(&c, &signals, now(), probation), expected, "{name}");
        }
        assert!(may_be_probed(&c, &HealthSignals { queue_depth: 3, ..failing }, now()));
        assert!(!may_be_probed(&c, &HealthSignals { last_failure_at: None, ..failing }, now()));
        assert!(!may_be_probed(&c, &HealthSignals { last_heartbeat: None, ..failing }, now()));
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
