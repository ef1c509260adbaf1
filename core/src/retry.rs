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
use crate::pack::{BackoffKind, CircuitSpec, RetryPolicy, RetryRule, RuleDo, RuleThen};
use serde_json::Value;

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
            circuit: None,
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
    /// The circuit breaker of every action without its own `retry.circuit` (`ATTUNE_CIRCUIT_*`);
    /// off by default.
    pub circuit: Option<CircuitSpec>,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            enabled: true,
            base_backoff_secs: 1.0,
            max_backoff_secs: 300.0,
            backoff_multiplier: 2.0,
            jitter_factor: 0.2,
            circuit: None,
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
        if let Some(c) = &self.circuit {
            if !(c.failure_rate > 0.0 && c.failure_rate <= 1.0) {
                return invalid("ATTUNE_CIRCUIT_FAILURE_RATE", c.failure_rate, "must be above 0 and at most 1");
            }
            if !(c.window_secs.is_finite() && c.window_secs > 0.0) {
                return invalid("ATTUNE_CIRCUIT_WINDOW_SECS", c.window_secs, "must be > 0");
            }
            if !(c.open_secs.is_finite() && c.open_secs > 0.0) {
                return invalid("ATTUNE_CIRCUIT_OPEN_SECS", c.open_secs, "must be > 0");
            }
            if c.min_executions < 1 {
                return invalid("ATTUNE_CIRCUIT_MIN_EXECUTIONS", f64::from(c.min_executions), "must be at least 1");
            }
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
    /// Tasker's `retryable`: `false` never retries, whatever the rules say.
    #[serde(default = "yes")]
    pub retryable: bool,
    /// The action's `retry.rules`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RetryRule>,
    /// The action's circuit breaker, else the global one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitSpec>,
}

fn yes() -> bool {
    true
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
            retryable: p.retryable.unwrap_or(true),
            rules: p.rules.unwrap_or_default(),
            circuit: p.circuit.or_else(|| config.circuit.clone()),
        }
    }

    /// This policy's backoff with a rule's own fields over it.
    fn with_rule(&self, then: &RuleThen) -> EffectivePolicy {
        let base_secs = then.delay_secs.unwrap_or(self.base_secs);
        EffectivePolicy {
            backoff: then.backoff.unwrap_or(self.backoff),
            base_secs,
            max_secs: then.max_delay_secs.unwrap_or(self.max_secs).max(base_secs),
            multiplier: then.multiplier.unwrap_or(self.multiplier),
            jitter: then.jitter.unwrap_or(self.jitter),
            ..self.clone()
        }
    }

    /// The index of the first rule whose `when` matches the attempt.
    pub fn matching_rule(&self, attempt: &FailedAttempt) -> Option<usize> {
        self.rules.iter().position(|rule| rule_matches(rule, attempt))
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

/// Whether `rule`'s `when` matches the failed attempt: any listed condition holding.
pub fn rule_matches(rule: &RetryRule, attempt: &FailedAttempt) -> bool {
    let when = &rule.when;
    let listed = |list: &Option<Vec<i32>>, value: Option<i32>| {
        value.is_some_and(|v| list.as_ref().is_some_and(|l| l.contains(&v)))
    };
    listed(&when.exit_codes, attempt.exit_code)
        || when.failure_kinds.as_ref().is_some_and(|kinds| kinds.contains(&attempt.failure))
        || listed(&when.http_status, attempt.http_status)
        || when.result.as_ref().is_some_and(|m| {
            let found = attempt.result.as_ref().and_then(|result| value_at(result, &m.segments()));
            found.is_some_and(|found| m.values().into_iter().any(|want| json_equal(found, want)))
        })
}

/// The value at `path` (object keys, array indices) in `value`, as PostgreSQL's `#>` finds it.
pub fn value_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |at, segment| match at {
        Value::Object(map) => map.get(*segment),
        Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// JSON equality as `jsonb` has it: numbers by value (`1` = `1.0`), objects whatever the key order.
pub fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_equal(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
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
    /// The action says `retry.retryable: false`.
    NotRetryable,
    /// A `retry.rules` entry matched and says `do: fail`.
    RuleSaysFail,
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
    /// The `retry.rules` entry (from 0) that matched, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_rule: Option<usize>,
    /// The earliest next attempt a `Retry-After` header asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<DateTime<Utc>>,
    /// The end of the open period of the action's circuit, which held the retry back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until: Option<DateTime<Utc>>,
}

impl DecisionRecord {
    pub fn new(
        policy: &EffectivePolicy,
        attempt: &FailedAttempt,
        decision: &RetryDecision,
        now: DateTime<Utc>,
    ) -> Self {
        let kind = attempt.failure;
        let matched_rule = match decision {
            RetryDecision::GiveUp(GiveUp::RuleSaysFail { rule }) => Some(*rule),
            RetryDecision::GiveUp(GiveUp::Exhausted { rule, .. }) => *rule,
            RetryDecision::Retry { rule, .. } => *rule,
            RetryDecision::GiveUp(_) => None,
        };
        let (rule, reason, delay_ms, next_attempt_at) = match decision {
            RetryDecision::Retry { at, delay, rule, .. } => {
                let by = match rule {
                    Some(i) => format!("retry.rules[{i}] matched ({})", describe_when(&policy.rules[*i])),
                    None => format!("'{kind}' is retried by this action's policy"),
                };
                let budget = match (rule.and_then(|i| policy.rules[i].then.attempts), attempt.max_retries) {
                    (Some(attempts), _) => format!("attempt {} of {attempts}", attempt.retry_count + 1),
                    (None, max) if max < 0 => format!("attempt {} of unlimited", attempt.retry_count + 1),
                    (None, max) => format!("{} of {max} retries used", attempt.retry_count),
                };
                let mut reason = format!(
                    "{by}, {budget}: retry {} runs after {:.3} s",
                    attempt.retry_count + 1,
                    delay.as_secs_f64()
                );
                if attempt.held_until.is_some_and(|held| held >= *at) {
                    reason.push_str(" (held back until the action's circuit half-opens)");
                } else if attempt.retry_after.is_some_and(|after| after >= *at) {
                    reason.push_str(" (as the response's Retry-After asked)");
                }
                (Rule::Retried, reason, Some(delay.as_millis() as u64), Some(*at))
            }
            RetryDecision::GiveUp(why) => {
                let rule = match why {
                    GiveUp::NotRetriable(kind) if kind.is_never_retried() => Rule::EndedByHand,
                    GiveUp::NotRetriable(_) => Rule::KindNotRetried,
                    GiveUp::NotIdempotent(_) => Rule::NotIdempotent,
                    GiveUp::Disabled => Rule::Disabled,
                    GiveUp::NotRetryable => Rule::NotRetryable,
                    GiveUp::RuleSaysFail { .. } => Rule::RuleSaysFail,
                    GiveUp::Exhausted { .. } => Rule::Exhausted,
                };
                let reason = match why {
                    GiveUp::RuleSaysFail { rule } => {
                        format!("not retried: {why} ({})", describe_when(&policy.rules[*rule]))
                    }
                    GiveUp::NotRetriable(_) | GiveUp::NotIdempotent(_) | GiveUp::NotRetryable => {
                        format!("not retried: {why}")
                    }
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
            matched_rule,
            retry_after: attempt.retry_after,
            held_until: attempt.held_until,
        }
    }
}

/// A rule's `when` in words: `http_status 503, 429 or exit code 3`.
pub fn describe_when(rule: &RetryRule) -> String {
    let when = &rule.when;
    let list = |name: &str, items: Vec<String>| format!("{name} {}", items.join(", "));
    let mut parts = Vec::new();
    if let Some(codes) = &when.exit_codes {
        parts.push(list("exit code", codes.iter().map(i32::to_string).collect()));
    }
    if let Some(kinds) = &when.failure_kinds {
        parts.push(list("failure kind", kinds.iter().map(|k| k.to_string()).collect()));
    }
    if let Some(statuses) = &when.http_status {
        parts.push(list("HTTP status", statuses.iter().map(i32::to_string).collect()));
    }
    if let Some(m) = &when.result {
        parts.push(list(&format!("result.{} in", m.path), m.values().iter().map(|v| v.to_string()).collect()));
    }
    parts.join(" or ")
}

/// Whether the execution "may have started" on a worker that then vanished.
fn worker_vanished_after_start(kind: FailureKind, started: bool) -> bool {
    kind == FailureKind::WorkerHeartbeatStale || (kind == FailureKind::WorkerUnavailable && started)
}

#[derive(Debug, Clone, PartialEq)]
pub enum GiveUp {
    Disabled,
    NotRetriable(FailureKind),
    /// `retry.retryable: false`.
    NotRetryable,
    /// `retry.rules[rule]` matched and says `do: fail`.
    RuleSaysFail {
        rule: usize,
    },
    /// No retries left: `max_retries` (`rule: None`) or the matching rule's `attempts`.
    Exhausted {
        retry_count: i32,
        max_retries: i32,
        rule: Option<usize>,
    },
    /// The action is not idempotent and may have started: the execution is `abandoned`.
    NotIdempotent(FailureKind),
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveUp::Disabled => write!(f, "retries are disabled"),
            GiveUp::NotRetriable(kind) => write!(f, "'{kind}' is not retried for this action"),
            GiveUp::NotRetryable => write!(f, "the action is not retryable (retry.retryable: false)"),
            GiveUp::RuleSaysFail { rule } => write!(f, "retry.rules[{rule}] matched and says fail"),
            GiveUp::Exhausted { retry_count, max_retries, rule: None } => {
                write!(f, "retries exhausted ({retry_count} of {max_retries})")
            }
            GiveUp::Exhausted { retry_count, max_retries, rule: Some(rule) } => write!(
                f,
                "retry.rules[{rule}] allows {} attempts and this was attempt {}",
                max_retries + 1,
                retry_count + 1
            ),
            GiveUp::NotIdempotent(kind) => {
                write!(f, "'{kind}' after the action may have started, and the action is not idempotent")
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RetryDecision {
    /// Retried at `at`, `delay` after now; `rule`: the `retry.rules` entry that decided it.
    Retry {
        at: DateTime<Utc>,
        delay: Duration,
        reason: FailureKind,
        rule: Option<usize>,
        /// A platform loss retried past the action's own budget: the retry counts one more of
        /// the chain's `PLATFORM_RETRIES`.
        paid_by_platform: bool,
    },
    GiveUp(GiveUp),
}

/// What the decision looks at for one failed execution.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedAttempt {
    pub failure: FailureKind,
    pub retry_count: i32,
    /// Retries after the first attempt; below 0: unlimited.
    pub max_retries: i32,
    /// The execution had started running (a worker claimed it).
    pub started: bool,
    pub exit_code: Option<i32>,
    /// The HTTP status an `http` action got.
    pub http_status: Option<i32>,
    /// The action's result.
    pub result: Option<Value>,
    /// The earliest next attempt the response asked for (`Retry-After`).
    pub retry_after: Option<DateTime<Utc>>,
    /// The end of the open period of the action's circuit: no retry runs before it.
    pub held_until: Option<DateTime<Utc>>,
    /// How many of the chain's retries so far were made for a platform loss
    /// (`FailureKind::is_platform_loss`): they did not spend the action's `max_retries`.
    pub platform_retries: i32,
}

impl FailedAttempt {
    pub fn new(failure: FailureKind, retry_count: i32, max_retries: i32, started: bool) -> Self {
        FailedAttempt {
            failure,
            retry_count,
            max_retries,
            started,
            exit_code: None,
            http_status: None,
            result: None,
            retry_after: None,
            held_until: None,
            platform_retries: 0,
        }
    }
}

/// How many retries a chain gets for platform losses (a worker or its supervisor lost, a dispatch
/// expired unstarted) beyond the action's own `max_retries`, which they never spend.
pub const PLATFORM_RETRIES: i32 = 3;

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
    if !policy.retryable {
        return RetryDecision::GiveUp(GiveUp::NotRetryable);
    }
    let rule = policy.matching_rule(attempt);
    let (backoff, max_retries) = match rule.map(|i| (i, &policy.rules[i].then)) {
        Some((i, then)) if then.action == RuleDo::Fail => {
            return RetryDecision::GiveUp(GiveUp::RuleSaysFail { rule: i });
        }
        Some((_, then)) => (policy.with_rule(then), then.attempts.map_or(attempt.max_retries, |a| a - 1)),
        None if !policy.retry_on.contains(&kind) => return RetryDecision::GiveUp(GiveUp::NotRetriable(kind)),
        None => (policy.clone(), attempt.max_retries),
    };
    // the action's own budget is spent by its own failures only; a platform loss (without a
    // rule of the policy's for it) is retried whatever that budget, up to PLATFORM_RETRIES
    // (the platform's retries are those it paid for, each counted once: never more than
    // PLATFORM_RETRIES in a chain)
    let own_retries = attempt.retry_count - attempt.platform_retries.clamp(0, attempt.retry_count);
    let own_spent = max_retries >= 0 && own_retries >= max_retries;
    let platform_left = rule.is_none() && kind.is_platform_loss() && attempt.platform_retries < PLATFORM_RETRIES;
    if own_spent && !platform_left {
        return RetryDecision::GiveUp(GiveUp::Exhausted { retry_count: attempt.retry_count, max_retries, rule });
    }
    let paid_by_platform = own_spent;
    let backed_off = now + chrono::Duration::milliseconds(backoff.delay(attempt.retry_count, rng).as_millis() as i64);
    let at =
        [Some(backed_off), attempt.retry_after, attempt.held_until].into_iter().flatten().max().unwrap_or(backed_off);
    let delay = (at - now).to_std().unwrap_or_default();
    RetryDecision::Retry { at, delay, reason: kind, rule, paid_by_platform }
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
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-02-09T12:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn default_policy() -> EffectivePolicy {
        EffectivePolicy::resolve(&RetrySettings::default(), None)
    }

    fn attempt(failure: FailureKind, retry_count: i32, max_retries: i32) -> FailedAttempt {
        FailedAttempt::new(failure, retry_count, max_retries, true)
    }

    #[test]
    fn what_a_person_ended_is_never_retried_whatever_the_policy() {
        let config = RetrySettings::default();
        let every_kind = RetryPolicy { on: Some(FailureKind::ALL.to_vec()), ..Default::default() };
        let policy = EffectivePolicy::resolve(&config, Some(&every_kind));
        let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        for kind in FailureKind::ALL {
            let attempt = FailedAttempt::new(kind, 0, 5, true);
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
                retryable: true,
                rules: vec![],
                circuit: None,
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
            RetryDecision::GiveUp(GiveUp::Exhausted { retry_count: 3, max_retries: 3, rule: None })
        );
    }

    #[test]
    fn the_retry_time_is_now_plus_the_delay() {
        let policy = default_policy();
        let mut rng = StdRng::seed_from_u64(5);
        match decide(&policy, &attempt(FailureKind::QueueTimeout, 2, 5), now(), &mut rng) {
            RetryDecision::Retry { at, delay, reason, .. } => {
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
        let attempt = |failure, retry_count, started| FailedAttempt::new(failure, retry_count, 2, started);
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

    /// The issue's rules, as a pack author writes them.
    const RULES: &str = "
rules:
  - when: {http_status: [429, 500, 502, 503, 504]}
    then: {do: retry, attempts: 10, backoff: exponential, delay_secs: 2}
  - when: {exit_codes: [3], failure_kinds: [timeout]}
    then: {do: retry, attempts: 2, backoff: fixed, delay_secs: 5}
  - when: {http_status: [401, 403]}
    then: {do: fail}
  - when: {result: {path: error.code, in: [rate_limited, busy]}}
    then: {do: retry, backoff: linear, delay_secs: 1, jitter: 0}
";

    fn ruled() -> EffectivePolicy {
        let policy: RetryPolicy = serde_yaml_ng::from_str(RULES).unwrap();
        EffectivePolicy::resolve(&RetrySettings { jitter_factor: 0.0, ..RetrySettings::default() }, Some(&policy))
    }

    #[test]
    fn the_first_matching_rule_decides_every_rule_form() {
        let policy = ruled();
        let mut rng = StdRng::seed_from_u64(8);
        let failed = |kind, retry_count| FailedAttempt::new(kind, retry_count, 3, true);
        let http = |status, retry_count| FailedAttempt {
            http_status: Some(status),
            ..failed(FailureKind::TransientError, retry_count)
        };
        let exit = |code, retry_count| FailedAttempt {
            exit_code: Some(code),
            ..failed(FailureKind::ActionFailed, retry_count)
        };
        let result = |value: Value| FailedAttempt { result: Some(value), ..failed(FailureKind::ActionFailed, 0) };
        // (attempt, matched rule, retried, delay in ms when retried)
        let table: Vec<(FailedAttempt, Option<usize>, bool, Option<u128>)> = vec![
            // http_status: 10 attempts, exponential from 2 s, past max_retries 3
            (http(503, 0), Some(0), true, Some(2000)),
            (http(429, 5), Some(0), true, Some(64_000)),
            (http(500, 9), Some(0), false, None),
            // exit code 3 or a timeout: 2 attempts, fixed 5 s (either condition matches)
            (exit(3, 0), Some(1), true, Some(5000)),
            (failed(FailureKind::Timeout, 0), Some(1), true, Some(5000)),
            (exit(3, 1), Some(1), false, None),
            // 401/403: fail, even with a retriable kind and budget left
            (http(401, 0), Some(2), false, None),
            (http(403, 0), Some(2), false, None),
            // a value in the result, `in` a list: linear from 1 s, the action's max_retries
            (result(json!({"error": {"code": "busy"}})), Some(3), true, Some(1000)),
            (
                FailedAttempt { retry_count: 2, ..result(json!({"error": {"code": "rate_limited"}})) },
                Some(3),
                true,
                Some(3000),
            ),
            (FailedAttempt { retry_count: 3, ..result(json!({"error": {"code": "busy"}})) }, Some(3), false, None),
            (result(json!({"error": {"code": "other"}})), None, false, None),
            (result(json!({"error": "busy"})), None, false, None),
            // no rule matches: the kind and max_retries decide, as without rules
            (http(404, 0), None, true, Some(1000)),
            (exit(1, 0), None, false, None),
            // (a platform loss is retried past max_retries only up to PLATFORM_RETRIES)
            (FailedAttempt { platform_retries: 3, ..failed(FailureKind::QueueTimeout, 6) }, None, false, None),
        ];
        for (attempt, rule, retried, delay) in table {
            assert_eq!(policy.matching_rule(&attempt), rule, "{attempt:?}");
            let decision = decide(&policy, &attempt, now(), &mut rng);
            let record = DecisionRecord::new(&policy, &attempt, &decision, now());
            assert_eq!(record.matched_rule, rule, "{attempt:?}: {decision:?}");
            match decision {
                RetryDecision::Retry { delay: got, rule: by, .. } => {
                    assert!(retried, "{attempt:?} was retried");
                    assert_eq!((Some(got.as_millis()), by), (delay, rule), "{attempt:?}");
                    if let Some(i) = rule {
                        assert!(record.reason.contains(&format!("retry.rules[{i}]")), "{}", record.reason);
                    }
                }
                RetryDecision::GiveUp(why) => {
                    assert!(!retried, "{attempt:?} was not retried: {why}");
                    if rule == Some(2) {
                        assert_eq!(why, GiveUp::RuleSaysFail { rule: 2 });
                        assert_eq!(record.rule, Rule::RuleSaysFail);
                        assert!(record.reason.contains("HTTP status 401, 403"), "{}", record.reason);
                    }
                }
            }
        }
    }

    #[test]
    fn result_paths_and_json_equality_are_postgresql_s() {
        let value = json!({"a": {"b": [10, {"c": 1.0}]}, "n": 2});
        assert_eq!(value_at(&value, &["a", "b", "0"]), Some(&json!(10)));
        assert_eq!(value_at(&value, &["a", "b", "1", "c"]), Some(&json!(1.0)));
        assert_eq!(value_at(&value, &["a", "b", "5"]), None);
        assert_eq!(value_at(&value, &["n", "x"]), None);
        assert!(json_equal(&json!(1), &json!(1.0)));
        assert!(json_equal(&json!({"x": [1, 2.0]}), &json!({"x": [1.0, 2]})));
        assert!(!json_equal(&json!("1"), &json!(1)));
        assert!(!json_equal(&json!([1, 2]), &json!([2, 1])));
    }

    #[test]
    fn unlimited_retries_never_run_out_but_stay_capped_in_delay() {
        let policy = default_policy();
        let mut rng = StdRng::seed_from_u64(9);
        for retry_count in [0, 10, 1000, 100_000] {
            match decide(&policy, &attempt(FailureKind::TransientError, retry_count, -1), now(), &mut rng) {
                RetryDecision::Retry { delay, .. } => assert!(delay <= Duration::from_secs(300), "{delay:?}"),
                other => panic!("unlimited retry {retry_count}: {other:?}"),
            }
        }
        // a person still ends it, and a kind not retried still is not
        assert!(matches!(
            decide(&policy, &attempt(FailureKind::Canceled, 5, -1), now(), &mut rng),
            RetryDecision::GiveUp(GiveUp::NotRetriable(_))
        ));
        assert!(matches!(
            decide(&policy, &attempt(FailureKind::ActionFailed, 5, -1), now(), &mut rng),
            RetryDecision::GiveUp(GiveUp::NotRetriable(_))
        ));
    }

    #[test]
    fn retry_after_and_an_open_circuit_push_the_next_attempt_back() {
        let policy = EffectivePolicy { jitter: 0.0, ..default_policy() };
        let mut rng = StdRng::seed_from_u64(10);
        let later = |secs| now() + chrono::Duration::seconds(secs);
        let base = attempt(FailureKind::TransientError, 0, 3);
        // (Retry-After, circuit hold, expected delay in s): the latest wins
        let table = [
            (None, None, 1),
            (Some(later(2)), None, 2),
            (None, Some(later(30)), 30),
            (Some(later(40)), Some(later(30)), 40),
            (Some(later(0)), None, 1),
        ];
        for (retry_after, held_until, want) in table {
            let attempt = FailedAttempt { retry_after, held_until, ..base.clone() };
            let decision = decide(&policy, &attempt, now(), &mut rng);
            let RetryDecision::Retry { at, delay, .. } = &decision else { panic!("{decision:?}") };
            assert_eq!((delay.as_secs(), *at), (want, later(want as i64)), "{attempt:?}");
            let record = DecisionRecord::new(&policy, &attempt, &decision, now());
            assert_eq!(record.held_until, held_until);
            if held_until.is_some_and(|h| h >= *at) {
                assert!(record.reason.contains("circuit"), "{}", record.reason);
            }
        }
    }

    #[test]
    fn retryable_false_wins_over_every_rule() {
        let policy = EffectivePolicy { retryable: false, ..ruled() };
        let attempt = FailedAttempt { http_status: Some(503), ..attempt(FailureKind::TransientError, 0, 3) };
        let decision = decide(&policy, &attempt, now(), &mut StdRng::seed_from_u64(11));
        assert_eq!(decision, RetryDecision::GiveUp(GiveUp::NotRetryable));
        assert_eq!(DecisionRecord::new(&policy, &attempt, &decision, now()).rule, Rule::NotRetryable);
    }

    #[test]
    fn a_platform_loss_is_retried_whatever_max_retries_and_spends_none_of_it() {
        let policy = EffectivePolicy::resolve(&RetrySettings::default(), None);
        let mut rng = StdRng::seed_from_u64(9);
        let retried = |attempt: &FailedAttempt, rng: &mut StdRng| {
            matches!(decide(&policy, attempt, now(), rng), RetryDecision::Retry { .. })
        };
        // max_retries 0: the supervisor or the worker lost is retried, three times in a chain
        for kind in [FailureKind::WorkerUnavailable, FailureKind::WorkerHeartbeatStale, FailureKind::QueueTimeout] {
            for platform_retries in 0..PLATFORM_RETRIES {
                let attempt = FailedAttempt { platform_retries, ..FailedAttempt::new(kind, platform_retries, 0, true) };
                assert!(retried(&attempt, &mut rng), "{kind} after {platform_retries} platform retries");
            }
            let attempt = FailedAttempt { platform_retries: 3, ..FailedAttempt::new(kind, 3, 0, true) };
            assert!(!retried(&attempt, &mut rng), "{kind}: the platform's retries are spent");
        }
        // with a budget of its own, platform losses spend it first, then the platform's three,
        // and no more (the count grows only when the platform pays)
        let mut chain = FailedAttempt::new(FailureKind::WorkerUnavailable, 0, 2, true);
        let mut retries = 0;
        while let RetryDecision::Retry { paid_by_platform, .. } = decide(&policy, &chain, now(), &mut rng) {
            retries += 1;
            chain.retry_count += 1;
            chain.platform_retries += i32::from(paid_by_platform);
            assert!(retries <= 10, "platform losses retried without end");
        }
        assert_eq!((retries, chain.platform_retries), (2 + PLATFORM_RETRIES, PLATFORM_RETRIES));
        // the action's own failures still have their whole budget after platform retries
        let after_losses =
            FailedAttempt { platform_retries: 2, ..FailedAttempt::new(FailureKind::TransientError, 2, 1, true) };
        assert!(retried(&after_losses, &mut rng), "one retry of its own left");
        let spent =
            FailedAttempt { platform_retries: 2, ..FailedAttempt::new(FailureKind::TransientError, 3, 1, true) };
        assert!(!retried(&spent, &mut rng));
        // an action failure is still its own
        assert!(!retried(&FailedAttempt::new(FailureKind::ActionFailed, 0, 0, true), &mut rng));
    }
}
