//! Retry policy: whether a failed execution is retried, and after how long.
//!
//! Backoff before retry n (n = the failed execution's `retry_count`, so the first retry waits
//! `base`): exponential `base × multiplier^n`, linear `base × (n + 1)` or fixed `base`, capped at
//! `max`, then jittered by ±`jitter` and capped again. With the defaults that is 1 s, 2 s, 4 s,
//! 8 s … up to 300 s, each ±20 %, never above 300 s, at millisecond precision.
//!
//! An execution is retried automatically when retries are enabled, its failure kind is one the
//! action retries (by default: worker_unavailable, queue_timeout, worker_heartbeat_stale,
//! transient_error, manual_retry; an action's `retry.on` replaces the list, and may add
//! `timeout`), and `retry_count < max_retries`. An action declared `idempotent: false` is not
//! retried once it may have started on a worker that vanished: it ends `abandoned` instead.
//! `is_execution_retriable(id)` in SQL makes the same decision.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::{Rng, RngExt};

use crate::ExecutionStatus;
use crate::failure::FailureKind;
use crate::pack::{BackoffKind, RetryPolicy};

/// The quick reference's retry configuration, field for field: its literal compiles as written.
///
/// ```
/// use attune_core::retry::{RetryConfig, RetrySettings};
/// // Default retry configuration
/// let config = RetryConfig {
/// enabled: true,
/// base_backoff_secs: 1,
/// max_backoff_secs: 300, // 5 minutes max
/// backoff_multiplier: 2.0,
/// jitter_factor: 0.2, // 20% jitter
/// };
/// assert_eq!(RetrySettings::from(config), RetrySettings::default());
/// ```
///
/// The executor runs with [`RetrySettings`], which takes fractions of a second as well
/// (`ATTUNE_RETRY_BASE_BACKOFF_SECS=0.2`); a `RetryConfig` converts into it.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    pub enabled: bool,
    pub base_backoff_secs: u64,
    pub max_backoff_secs: u64,
    pub backoff_multiplier: f64,
    pub jitter_factor: f64,
}

impl From<RetryConfig> for RetrySettings {
    fn from(c: RetryConfig) -> Self {
        RetrySettings {
            enabled: c.enabled,
            base_backoff_secs: c.base_backoff_secs as f64,
            max_backoff_secs: c.max_backoff_secs as f64,
            backoff_multiplier: c.backoff_multiplier,
            jitter_factor: c.jitter_factor,
        }
    }
}

/// The global retry settings in force (`ATTUNE_RETRY_*`): the quick reference's
/// [`RetryConfig`] with the backoff in seconds and fractions of one.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySettings {
    pub enabled: bool,
    pub base_backoff_secs: f64,
    pub max_backoff_secs: f64,
    pub backoff_multiplier: f64,
    pub jitter_factor: f64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            enabled: true,
            base_backoff_secs: 1.0,
            max_backoff_secs: 300.0,
            backoff_multiplier: 2.0,
            jitter_factor: 0.2,
        }
    }
}

/// A global retry setting out of range, named by the environment variable that sets it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid value {value:?} for {name}: {reason}")]
pub struct InvalidSetting {
    pub name: &'static str,
    pub value: String,
    pub reason: &'static str,
}

impl RetrySettings {
    /// Checks the global settings; the error names the environment variable that sets the field.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let invalid = |name: &'static str, value: f64, reason: &'static str| {
            Err(InvalidSetting { name, value: value.to_string(), reason })
        };
        if !(self.base_backoff_secs >= 0.0 && self.base_backoff_secs.is_finite()) {
            return invalid("ATTUNE_RETRY_BASE_BACKOFF_SECS", self.base_backoff_secs, "must be >= 0");
        }
        if !(self.max_backoff_secs >= self.base_backoff_secs && self.max_backoff_secs.is_finite()) {
            return invalid("ATTUNE_RETRY_MAX_BACKOFF_SECS", self.max_backoff_secs, "must be >= the base backoff");
        }
        if !(self.backoff_multiplier >= 1.0 && self.backoff_multiplier.is_finite()) {
            return invalid("ATTUNE_RETRY_BACKOFF_MULTIPLIER", self.backoff_multiplier, "must be >= 1.0");
        }
        if !(0.0..=1.0).contains(&self.jitter_factor) {
            return invalid("ATTUNE_RETRY_JITTER_FACTOR", self.jitter_factor, "must be between 0 and 1");
        }
        Ok(())
    }
}

/// The policy in force for one action: its `retry:` block over the global config.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EffectivePolicy {
    pub enabled: bool,
    pub backoff: BackoffKind,
    pub base_secs: f64,
    pub max_secs: f64,
    pub multiplier: f64,
    pub jitter: f64,
    pub retry_on: Vec<FailureKind>,
    pub idempotent: bool,
}

impl EffectivePolicy {
    pub fn resolve(config: &RetrySettings, policy: Option<&RetryPolicy>) -> Self {
        let p = policy.cloned().unwrap_or_default();
        let base_secs = p.base_delay_secs.unwrap_or(config.base_backoff_secs);
        EffectivePolicy {
            enabled: config.enabled,
            backoff: p.backoff.unwrap_or(BackoffKind::Exponential),
            base_secs,
            max_secs: p.max_delay_secs.unwrap_or(config.max_backoff_secs).max(base_secs),
            multiplier: p.multiplier.unwrap_or(config.backoff_multiplier),
            jitter: p.jitter.unwrap_or(config.jitter_factor),
            retry_on: p.on.unwrap_or_else(|| FailureKind::RETRIABLE_BY_DEFAULT.to_vec()),
            idempotent: p.idempotent.unwrap_or(true),
        }
    }

    /// The backoff before retry `n` without jitter, capped at `max`.
    pub fn base_delay(&self, n: i32) -> f64 {
        let n = n.max(0);
        let raw = match self.backoff {
            BackoffKind::Fixed => self.base_secs,
            BackoffKind::Linear => self.base_secs * f64::from(n + 1),
            BackoffKind::Exponential => self.base_secs * self.multiplier.powi(n.min(1000)),
        };
        if raw.is_finite() { raw.min(self.max_secs) } else { self.max_secs }
    }

    /// The jittered backoff before retry `n`: within ±jitter of `base_delay(n)`, never above
    /// `max`, in whole milliseconds.
    pub fn delay(&self, n: i32, rng: &mut impl Rng) -> Duration {
        let base = self.base_delay(n);
        let factor = if self.jitter > 0.0 { 1.0 + rng.random_range(-self.jitter..=self.jitter) } else { 1.0 };
        let secs = (base * factor).clamp(0.0, self.max_secs);
        Duration::from_millis((secs * 1000.0).floor() as u64)
    }
}

/// The rule of `decide` that settled a failed execution's fate, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A person ended it on purpose (`canceled`, `operator_failed`): never retried.
    EndedByHand,
    /// It may have run on a worker that vanished, and the action is not idempotent: `abandoned`.
    NotIdempotent,
    /// Retries are disabled (`ATTUNE_RETRY_ENABLED=false`).
    Disabled,
    /// Its failure kind is not one the action's policy retries (`retry.on`, else the retriable kinds).
    KindNotRetried,
    /// Its retries are used up (`retry_count >= max_retries`).
    Exhausted,
    /// Retried: a retriable kind with retries left.
    Retried,
}

/// What the RetryManager decided for one failed execution, recorded on it (`retry_decision`)
/// and shown by the chain API and `attune execution explain`: its kind, its count, the policy in
/// force and the rule that decided.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DecisionRecord {
    pub retried: bool,
    pub rule: Rule,
    /// The decision in words.
    pub reason: String,
    pub failure_kind: FailureKind,
    pub retry_count: i32,
    pub max_retries: i32,
    /// The backoff before the retry, and when it runs (when retried).
    pub delay_ms: Option<u64>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub policy: EffectivePolicy,
    pub decided_at: DateTime<Utc>,
}

impl DecisionRecord {
    pub fn new(
        policy: &EffectivePolicy,
        attempt: &FailedAttempt,
        decision: &RetryDecision,
        now: DateTime<Utc>,
    ) -> Self {
        let kind = attempt.failure;
        let (rule, reason, delay_ms, next_attempt_at) = match decision {
            RetryDecision::Retry { at, delay, .. } => (
                Rule::Retried,
                format!(
                    "'{kind}' is retried by this action's policy, and {} of {} retries were used: retry {} runs after {:.3} s",
                    attempt.retry_count,
                    attempt.max_retries,
                    attempt.retry_count + 1,
                    delay.as_secs_f64()
                ),
                Some(delay.as_millis() as u64),
                Some(*at),
            ),
            RetryDecision::GiveUp(why) => {
                let rule = match why {
                    GiveUp::NotRetriable(kind) if kind.is_never_retried() => Rule::EndedByHand,
                    GiveUp::NotRetriable(_) => Rule::KindNotRetried,
                    GiveUp::NotIdempotent(_) => Rule::NotIdempotent,
                    GiveUp::Disabled => Rule::Disabled,
                    GiveUp::Exhausted { .. } => Rule::Exhausted,
                };
                let reason = match why {
                    GiveUp::NotRetriable(_) | GiveUp::NotIdempotent(_) => format!("not retried: {why}"),
                    GiveUp::Disabled | GiveUp::Exhausted { .. } => format!("'{kind}' is not retried: {why}"),
                };
                (rule, reason, None, None)
            }
        };
        DecisionRecord {
            retried: matches!(decision, RetryDecision::Retry { .. }),
            rule,
            reason,
            failure_kind: kind,
            retry_count: attempt.retry_count,
            max_retries: attempt.max_retries,
            delay_ms,
            next_attempt_at,
            policy: policy.clone(),
            decided_at: now,
        }
    }
}

/// Whether the execution "may have started" on a worker that then vanished.
fn worker_vanished_after_start(kind: FailureKind, started: bool) -> bool {
    kind == FailureKind::WorkerHeartbeatStale || (kind == FailureKind::WorkerUnavailable && started)
}

#[derive(Debug, Clone, PartialEq)]
pub enum GiveUp {
    Disabled,
    NotRetriable(FailureKind),
    Exhausted {
        retry_count: i32,
        max_retries: i32,
    },
    /// The action is not idempotent and may have started: the execution is `abandoned`.
    NotIdempotent(FailureKind),
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveUp::Disabled => write!(f, "retries are disabled"),
            GiveUp::NotRetriable(kind) => write!(f, "'{kind}' is not retried for this action"),
            GiveUp::Exhausted { retry_count, max_retries } => {
                write!(f, "retries exhausted ({retry_count} of {max_retries})")
            }
            GiveUp::NotIdempotent(kind) => {
                write!(f, "'{kind}' after the action may have started, and the action is not idempotent")
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RetryDecision {
    Retry { at: DateTime<Utc>, delay: Duration, reason: FailureKind },
    GiveUp(GiveUp),
}

/// What the decision looks at for one failed execution.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedAttempt {
    pub failure: FailureKind,
    pub retry_count: i32,
    pub max_retries: i32,
    /// The execution had started running (a worker claimed it).
    pub started: bool,
}

/// The pure retry decision.
pub fn decide(
    policy: &EffectivePolicy,
    attempt: &FailedAttempt,
    now: DateTime<Utc>,
    rng: &mut impl Rng,
) -> RetryDecision {
    let kind = attempt.failure;
    if kind.is_never_retried() {
        return RetryDecision::GiveUp(GiveUp::NotRetriable(kind));
    }
    if !policy.idempotent && worker_vanished_after_start(kind, attempt.started) {
        return RetryDecision::GiveUp(GiveUp::NotIdempotent(kind));
    }
    if !policy.enabled {
        return RetryDecision::GiveUp(GiveUp::Disabled);
    }
    if !policy.retry_on.contains(&kind) {
        return RetryDecision::GiveUp(GiveUp::NotRetriable(kind));
    }
    if attempt.retry_count >= attempt.max_retries {
        return RetryDecision::GiveUp(GiveUp::Exhausted {
            retry_count: attempt.retry_count,
            max_retries: attempt.max_retries,
        });
    }
    let delay = policy.delay(attempt.retry_count, rng);
    let at = now + chrono::Duration::milliseconds(delay.as_millis() as i64);
    RetryDecision::Retry { at, delay, reason: kind }
}

/// The status a failure is recorded with: `abandoned` when the action may have run on a worker
/// that vanished and is not idempotent, otherwise the status the reporter asked for.
pub fn recorded_status(decision: &RetryDecision, reported: ExecutionStatus) -> ExecutionStatus {
    match decision {
        RetryDecision::GiveUp(GiveUp::NotIdempotent(_)) => ExecutionStatus::Abandoned,
        _ => reported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-02-09T12:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn default_policy() -> EffectivePolicy {
        EffectivePolicy::resolve(&RetrySettings::default(), None)
    }

    fn attempt(failure: FailureKind, retry_count: i32, max_retries: i32) -> FailedAttempt {
        FailedAttempt { failure, retry_count, max_retries, started: true }
    }

    #[test]
    fn what_a_person_ended_is_never_retried_whatever_the_policy() {
        let config = RetrySettings::default();
        let every_kind = RetryPolicy { on: Some(FailureKind::ALL.to_vec()), ..Default::default() };
        let policy = EffectivePolicy::resolve(&config, Some(&every_kind));
        let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        for kind in FailureKind::ALL {
            let attempt = FailedAttempt { failure: kind, retry_count: 0, max_retries: 5, started: true };
            let decision = decide(&policy, &attempt, now, &mut rng);
            assert_eq!(
                matches!(decision, RetryDecision::GiveUp(GiveUp::NotRetriable(_))),
                kind.is_never_retried(),
                "{kind}: {decision:?}"
            );
        }
    }

    #[test]
    fn the_backoff_table_doubles_from_one_second_and_caps_at_300() {
        let policy = default_policy();
        let expected = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0];
        for (n, want) in expected.iter().enumerate() {
            assert_eq!(policy.base_delay(n as i32), *want, "retry {n}");
        }
        assert_eq!(policy.base_delay(10_000), 300.0);
        let mut rng = StdRng::seed_from_u64(7);
        for (n, want) in expected.iter().enumerate() {
            for _ in 0..200 {
                let secs = policy.delay(n as i32, &mut rng).as_secs_f64();
                assert!(secs >= want * 0.8 - 0.001 && secs <= (want * 1.2).min(300.0), "retry {n}: {secs}");
            }
        }
    }

    #[test]
    fn jitter_is_spread_and_reproducible_with_a_seed() {
        let policy = default_policy();
        let sample = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..50).map(|_| policy.delay(3, &mut rng).as_millis()).collect::<Vec<_>>()
        };
        assert_eq!(sample(42), sample(42));
        let values = sample(42);
        assert!(values.iter().any(|&ms| ms < 8000) && values.iter().any(|&ms| ms > 8000));
    }

    #[test]
    fn backoff_bounds_hold_for_random_policies() {
        let mut rng = StdRng::seed_from_u64(0xbac0ff);
        for _ in 0..5000 {
            let base = rng.random_range(0.0..50.0);
            let policy = EffectivePolicy {
                enabled: true,
                backoff: [BackoffKind::Fixed, BackoffKind::Linear, BackoffKind::Exponential][rng.random_range(0..3)],
                base_secs: base,
                max_secs: base + rng.random_range(0.0..500.0),
                multiplier: rng.random_range(1.0..5.0),
                jitter: rng.random_range(0.0..=1.0),
                retry_on: vec![],
                idempotent: true,
            };
            let n = rng.random_range(0..200);
            let nominal = policy.base_delay(n);
            let delay = policy.delay(n, &mut rng);
            // millisecond precision
            assert_eq!(delay.subsec_nanos() % 1_000_000, 0);
            let delay = delay.as_secs_f64();
            assert!(nominal <= policy.max_secs, "{policy:?} n={n}");
            assert!(delay <= policy.max_secs + 1e-9, "{policy:?} n={n}: {delay}");
            assert!(delay >= nominal * (1.0 - policy.jitter) - 0.001, "{policy:?} n={n}: {delay}");
            assert!(delay <= nominal * (1.0 + policy.jitter) + 0.001, "{policy:?} n={n}: {delay}");
        }
    }

    #[test]
    fn linear_and_fixed_backoff() {
        let config = RetrySettings::default();
        let policy = |backoff| {
            EffectivePolicy::resolve(
                &config,
                Some(&RetryPolicy {
                    backoff: Some(backoff),
                    base_delay_secs: Some(2.0),
                    max_delay_secs: Some(7.0),
                    jitter: Some(0.0),
                    ..Default::default()
                }),
            )
        };
        let linear: Vec<f64> = (0..5).map(|n| policy(BackoffKind::Linear).base_delay(n)).collect();
        assert_eq!(linear, vec![2.0, 4.0, 6.0, 7.0, 7.0]);
        let fixed: Vec<f64> = (0..3).map(|n| policy(BackoffKind::Fixed).base_delay(n)).collect();
        assert_eq!(fixed, vec![2.0, 2.0, 2.0]);
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(policy(BackoffKind::Fixed).delay(5, &mut rng), Duration::from_secs(2));
    }

    #[test]
    fn classification_decides_retry_or_give_up() {
        let policy = default_policy();
        let mut rng = StdRng::seed_from_u64(3);
        for kind in FailureKind::ALL {
            let decision = decide(&policy, &attempt(kind, 0, 3), now(), &mut rng);
            let retried = matches!(decision, RetryDecision::Retry { .. });
            assert_eq!(retried, kind.is_retriable_by_default(), "{kind}: {decision:?}");
        }
    }

    #[test]
    fn max_retries_boundaries() {
        let policy = default_policy();
        let mut rng = StdRng::seed_from_u64(4);
        let retried = |retry_count, max_retries, rng: &mut StdRng| {
            matches!(
                decide(&policy, &attempt(FailureKind::TransientError, retry_count, max_retries), now(), rng),
                RetryDecision::Retry { .. }
            )
        };
        // max_retries 0: the first attempt runs, nothing after it.
        assert!(!retried(0, 0, &mut rng));
        // max_retries 1: one retry.
        assert!(retried(0, 1, &mut rng));
        assert!(!retried(1, 1, &mut rng));
        // max_retries 3: at most 4 attempts (retry counts 0, 1, 2 are retried; 3 is the last).
        let attempts = (0..10).take_while(|&n| retried(n, 3, &mut rng)).count() + 1;
        assert_eq!(attempts, 4);
        assert_eq!(
            decide(&policy, &attempt(FailureKind::TransientError, 3, 3), now(), &mut rng),
            RetryDecision::GiveUp(GiveUp::Exhausted { retry_count: 3, max_retries: 3 })
        );
    }

    #[test]
    fn the_retry_time_is_now_plus_the_delay() {
        let policy = default_policy();
        let mut rng = StdRng::seed_from_u64(5);
        match decide(&policy, &attempt(FailureKind::QueueTimeout, 2, 5), now(), &mut rng) {
            RetryDecision::Retry { at, delay, reason } => {
                assert_eq!(reason, FailureKind::QueueTimeout);
                assert_eq!((at - now()).num_milliseconds(), delay.as_millis() as i64);
                assert!((3200..=4800).contains(&delay.as_millis()), "{delay:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn policy_overrides_kinds_idempotency_and_enabled() {
        let config = RetrySettings::default();
        let mut rng = StdRng::seed_from_u64(6);
        let with = |on: Option<Vec<FailureKind>>, idempotent| {
            EffectivePolicy::resolve(&config, Some(&RetryPolicy { on, idempotent, ..Default::default() }))
        };
        let timeouts = with(Some(vec![FailureKind::Timeout]), None);
        assert!(matches!(
            decide(&timeouts, &attempt(FailureKind::Timeout, 0, 1), now(), &mut rng),
            RetryDecision::Retry { .. }
        ));
        assert!(matches!(
            decide(&timeouts, &attempt(FailureKind::TransientError, 0, 1), now(), &mut rng),
            RetryDecision::GiveUp(_)
        ));

        let careful = with(None, Some(false));
        let stale = attempt(FailureKind::WorkerHeartbeatStale, 0, 3);
        let decision = decide(&careful, &stale, now(), &mut rng);
        assert_eq!(decision, RetryDecision::GiveUp(GiveUp::NotIdempotent(FailureKind::WorkerHeartbeatStale)));
        assert_eq!(recorded_status(&decision, ExecutionStatus::Failed), ExecutionStatus::Abandoned);
        // never started: safe to retry even when not idempotent
        let not_started = FailedAttempt { started: false, ..attempt(FailureKind::WorkerUnavailable, 0, 3) };
        assert!(matches!(decide(&careful, &not_started, now(), &mut rng), RetryDecision::Retry { .. }));
        assert!(matches!(
            decide(&careful, &attempt(FailureKind::QueueTimeout, 0, 3), now(), &mut rng),
            RetryDecision::Retry { .. }
        ));

        let disabled = EffectivePolicy::resolve(&RetrySettings { enabled: false, ..config.clone() }, None);
        assert_eq!(
            decide(&disabled, &attempt(FailureKind::TransientError, 0, 3), now(), &mut rng),
            RetryDecision::GiveUp(GiveUp::Disabled)
        );
    }

    #[test]
    fn every_decision_is_recorded_with_the_rule_that_made_it() {
        let now = now();
        let policy = EffectivePolicy::resolve(&RetrySettings::default(), None);
        let attempt = |failure, retry_count, started| FailedAttempt { failure, retry_count, max_retries: 2, started };
        let mut rng = StdRng::seed_from_u64(7);
        let cases = [
            (attempt(FailureKind::TransientError, 0, true), Rule::Retried),
            (attempt(FailureKind::TransientError, 2, true), Rule::Exhausted),
            (attempt(FailureKind::ActionFailed, 0, true), Rule::KindNotRetried),
            (attempt(FailureKind::Canceled, 0, true), Rule::EndedByHand),
            (attempt(FailureKind::OperatorFailed, 0, false), Rule::EndedByHand),
        ];
        for (attempt, rule) in cases {
            let decision = decide(&policy, &attempt, now, &mut rng);
            let record = DecisionRecord::new(&policy, &attempt, &decision, now);
            assert_eq!((record.rule, record.retried), (rule, rule == Rule::Retried), "{attempt:?}");
            assert_eq!(record.delay_ms.is_some(), rule == Rule::Retried);
            assert!(record.reason.contains(attempt.failure.as_str()), "{}", record.reason);
            let json = serde_json::to_value(&record).unwrap();
            assert_eq!(serde_json::from_value::<DecisionRecord>(json).unwrap(), record);
        }
        let not_idempotent = EffectivePolicy { idempotent: false, ..policy.clone() };
        let stale = attempt(FailureKind::WorkerHeartbeatStale, 0, true);
        let decision = decide(&not_idempotent, &stale, now, &mut rng);
        assert_eq!(DecisionRecord::new(&not_idempotent, &stale, &decision, now).rule, Rule::NotIdempotent);
        let disabled = EffectivePolicy { enabled: false, ..policy };
        let transient = attempt(FailureKind::TransientError, 0, true);
        let decision = decide(&disabled, &transient, now, &mut rng);
        assert_eq!(DecisionRecord::new(&disabled, &transient, &decision, now).rule, Rule::Disabled);
    }
}
