//! The per-action circuit breaker: when an action keeps failing, its retries (and its waiting
//! executions) are held back instead of hammering whatever it depends on.
//!
//! - **closed**: executions run. After each counted failure, if at least `min_executions` of the
//!   action finished since the later of `window_secs` ago and the circuit's last close, and at
//!   least `failure_rate` of them failed, the circuit **opens** for `open_secs`.
//! - **open**: no execution of the action is dispatched; a retry created now is delayed to the end
//!   of the open period (held back, not spent).
//! - **half-open** (the open period is over): exactly one execution, the trial, is dispatched. Its
//!   success closes the circuit; its failure opens it again for `open_secs`.
//!
//! A counted failure is one the action itself had (`transient_error`, `action_failed`,
//! `timeout`): a worker that vanished or a queue that expired says nothing about the dependency.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::FailureKind;
use crate::pack::CircuitSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

impl CircuitState {
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [CircuitState::Closed, CircuitState::Open, CircuitState::HalfOpen].into_iter().find(|s| s.as_str() == text)
    }

    /// The value of the `attune_action_circuit_state` gauge: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> f64 {
        match self {
            CircuitState::Closed => 0.0,
            CircuitState::Open => 1.0,
            CircuitState::HalfOpen => 2.0,
        }
    }
}

/// One action's circuit as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Circuit {
    pub state: CircuitState,
    /// The end of the open period (open and half-open).
    pub open_until: Option<DateTime<Utc>>,
    /// The execution let through while half-open.
    pub trial: Option<i64>,
    /// Failures before this are forgotten: the circuit closed then.
    pub closed_at: DateTime<Utc>,
}

impl Circuit {
    pub fn closed(at: DateTime<Utc>) -> Self {
        Circuit { state: CircuitState::Closed, open_until: None, trial: None, closed_at: at }
    }

    /// When a retry created now may run at the earliest: the end of the open period while the
    /// circuit is open, one more open period while a trial decides (half-open).
    pub fn held_until(&self, spec: &CircuitSpec, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.state {
            CircuitState::Closed => None,
            CircuitState::Open => self.open_until.filter(|until| *until > now).or(Some(now)),
            CircuitState::HalfOpen => Some(now + secs(spec.open_secs)),
        }
    }
}

fn secs(secs: f64) -> chrono::Duration {
    chrono::Duration::milliseconds((secs * 1000.0).round() as i64)
}

/// Whether a failure of this kind counts against the action's circuit.
pub fn counts(kind: FailureKind) -> bool {
    matches!(kind, FailureKind::TransientError | FailureKind::ActionFailed | FailureKind::Timeout)
}

/// The action's executions finished in the window (this failure included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    pub finished: i64,
    pub failed: i64,
}

/// Where the window starts: `window_secs` ago, or the last close if that is later.
pub fn window_start(spec: &CircuitSpec, circuit: &Circuit, now: DateTime<Utc>) -> DateTime<Utc> {
    (now - secs(spec.window_secs)).max(circuit.closed_at)
}

/// The circuit after a counted failure of `execution`, with `window` counting it.
pub fn after_failure(
    spec: &CircuitSpec,
    circuit: &Circuit,
    window: Window,
    execution: i64,
    now: DateTime<Utc>,
) -> Circuit {
    let open =
        Circuit { state: CircuitState::Open, open_until: Some(now + secs(spec.open_secs)), trial: None, ..*circuit };
    match circuit.state {
        CircuitState::Open | CircuitState::HalfOpen if circuit.trial == Some(execution) => open,
        CircuitState::Open | CircuitState::HalfOpen => circuit.clone(),
        CircuitState::Closed => {
            let tripped = window.finished >= i64::from(spec.min_executions)
                && window.finished > 0
                && window.failed as f64 / window.finished as f64 >= spec.failure_rate;
            if tripped { open } else { circuit.clone() }
        }
    }
}

/// The circuit after a success of `execution`: any success closes it (the trial's, or one that
/// was already running when it opened).
pub fn after_success(circuit: &Circuit, now: DateTime<Utc>) -> Circuit {
    match circuit.state {
        CircuitState::Closed => circuit.clone(),
        CircuitState::Open | CircuitState::HalfOpen => Circuit::closed(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn spec() -> CircuitSpec {
        CircuitSpec { failure_rate: 0.5, window_secs: 60.0, min_executions: 4, open_secs: 30.0 }
    }

    #[test]
    fn it_opens_at_the_rate_once_enough_executions_finished() {
        let closed = Circuit::closed(at(0));
        // (finished, failed, opens)
        let table = [(3, 3, false), (4, 1, false), (4, 2, true), (10, 4, false), (10, 5, true), (0, 0, false)];
        for (finished, failed, opens) in table {
            let next = after_failure(&spec(), &closed, Window { finished, failed }, 7, at(100));
            assert_eq!(next.state == CircuitState::Open, opens, "{finished}/{failed}");
            if opens {
                assert_eq!(next.open_until, Some(at(130)));
                assert_eq!(next.held_until(&spec(), at(110)), Some(at(130)));
            }
        }
    }

    #[test]
    fn only_the_trials_failure_reopens_and_any_success_closes() {
        let half =
            Circuit { state: CircuitState::HalfOpen, open_until: Some(at(130)), trial: Some(9), closed_at: at(0) };
        let window = Window { finished: 100, failed: 100 };
        assert_eq!(after_failure(&spec(), &half, window, 8, at(131)), half, "a failure that is not the trial's");
        let reopened = after_failure(&spec(), &half, window, 9, at(131));
        assert_eq!((reopened.state, reopened.open_until, reopened.trial), (CircuitState::Open, Some(at(161)), None));
        let closed = after_success(&half, at(140));
        assert_eq!(closed, Circuit::closed(at(140)));
        assert_eq!(window_start(&spec(), &closed, at(150)), at(140), "failures before the close are forgotten");
        assert_eq!(window_start(&spec(), &closed, at(300)), at(240));
        assert_eq!(half.held_until(&spec(), at(131)), Some(at(161)));
        assert_eq!(Circuit::closed(at(0)).held_until(&spec(), at(5)), None);
    }

    #[test]
    fn only_the_actions_own_failures_count() {
        let counted: Vec<_> = FailureKind::ALL.into_iter().filter(|k| counts(*k)).collect();
        assert_eq!(counted, [FailureKind::TransientError, FailureKind::ActionFailed, FailureKind::Timeout]);
        for state in [CircuitState::Closed, CircuitState::Open, CircuitState::HalfOpen] {
            assert_eq!(CircuitState::parse(state.as_str()), Some(state));
        }
    }
}
