//! The recovery rules: what the timeout monitor does with work the message flow lost, and when an
//! operator may retry an execution by hand. The adapters find the rows (`db::execution`) and carry
//! the decision out; the rules themselves live here, each with its table test.

use std::time::Duration;

use serde_json::Value;

use crate::{ExecutionStatus, FailureKind};

/// What the monitor does with one execution it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// It never started: back to waiting, no retry spent.
    HandBack,
    /// Failed with this kind (then retried or not by the retry policy).
    Fail { kind: FailureKind, reason: &'static str },
}

/// The monitor's limits (from the executor's settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MonitorLimits {
    /// A `scheduling` claim (left by an earlier version) older than this is given up.
    pub scheduling_timeout: Duration,
    /// A dispatch expires in its worker's queue after this.
    pub queue_ttl: Duration,
    /// Slack past every deadline, so the monitor never races the normal path.
    pub grace: Duration,
}

impl MonitorLimits {
    /// How long an execution may sit unchanged in `status` before the monitor takes it back,
    /// and what it then does; `None`: the status is never stuck (the normal flow, or a worker's
    /// heartbeat, or its own deadline answers for it).
    pub fn stuck(&self, status: ExecutionStatus) -> Option<(Duration, Recovery)> {
        match status {
            ExecutionStatus::Scheduling => Some((
                self.scheduling_timeout,
                Recovery::Fail { kind: FailureKind::WorkerUnavailable, reason: "stuck in scheduling" },
            )),
            // its dispatch would long have expired, and no worker holds it (workers keep what
            // they hold marked): the dispatch was lost before it started
            ExecutionStatus::Scheduled => Some((self.queue_ttl + self.grace, Recovery::HandBack)),
            _ => None,
        }
    }
}

/// The statuses the monitor sweeps for being stuck, in the order it sweeps them.
pub const STUCK_STATUSES: [ExecutionStatus; 2] = [ExecutionStatus::Scheduling, ExecutionStatus::Scheduled];

/// An execution whose worker stopped heartbeating: dispatched work never started and waits again;
/// running work failed as `worker_heartbeat_stale`. `None` for a status a worker does not hold.
pub fn orphaned(status: ExecutionStatus) -> Option<Recovery> {
    match status {
        ExecutionStatus::Scheduled => Some(Recovery::HandBack),
        ExecutionStatus::Running => Some(Recovery::Fail {
            kind: FailureKind::WorkerHeartbeatStale,
            reason: "its worker stopped heartbeating while it ran",
        }),
        _ => None,
    }
}

/// How long a worker that did not receive a dispatch, though it heartbeats, is passed over: a
/// heartbeat limit (`heartbeat_max_age_secs`), the time a silent worker is given before it is
/// taken for dead, and at least 1 s. Its next dispatch after that tests whether it receives
/// again; a worker the broker still cannot reach loses that one too, after the monitor's slack.
pub fn not_receiving_for(heartbeat_max_age_secs: i64) -> Duration {
    Duration::from_secs(heartbeat_max_age_secs.max(1) as u64)
}

/// The statuses a worker holds (an execution in one of them has `worker` set).
pub const HELD_BY_WORKER: [ExecutionStatus; 2] = ExecutionStatus::IN_FLIGHT;

/// A `running` execution well past its deadline: started longer ago than its own timeout (or the
/// default) plus the grace (`db::execution::monitor::overdue` finds them).
pub const OVERDUE: Recovery =
    Recovery::Fail { kind: FailureKind::Timeout, reason: "still running well past its timeout" };

/// What the manual-retry endpoint knows when it decides.
#[derive(Debug, Clone, Copy)]
pub struct ManualRetryRequest<'a> {
    pub parent_id: i64,
    pub parent_status: ExecutionStatus,
    pub parent_action_ref: &'a str,
    /// The execution that already retries the parent, if any.
    pub existing_retry: Option<i64>,
    /// The action the client named (a retry submitted as a new execution names it), if any.
    pub action_ref: Option<&'a str>,
}

/// Why a manual retry is refused; each names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManualRetryRefusal {
    #[error("execution {id} is {status}; only a finished execution can be retried")]
    NotTerminal { id: i64, status: ExecutionStatus },
    #[error("execution {id} was already retried by execution {retry}")]
    AlreadyRetried { id: i64, retry: i64 },
    #[error("execution {id} ran '{ran}', not '{asked}'")]
    OtherAction { id: i64, ran: String, asked: String },
    #[error("'config.max_retries' must be between 0 and 100")]
    MaxRetriesOutOfRange,
}

/// An operator's retry is allowed on any terminal execution not retried yet, whatever its failure
/// kind or retry count, for the action it ran. (Its parameters are checked next, by the action's
/// declarations, and its budget last: `retry_budget`.)
pub fn manual_retry(request: &ManualRetryRequest<'_>) -> Result<(), ManualRetryRefusal> {
    if !request.parent_status.is_terminal() {
        return Err(ManualRetryRefusal::NotTerminal { id: request.parent_id, status: request.parent_status });
    }
    if let Some(retry) = request.existing_retry {
        return Err(ManualRetryRefusal::AlreadyRetried { id: request.parent_id, retry });
    }
    if let Some(asked) = request.action_ref
        && asked != request.parent_action_ref
    {
        return Err(ManualRetryRefusal::OtherAction {
            id: request.parent_id,
            ran: request.parent_action_ref.to_string(),
            asked: asked.to_string(),
        });
    }
    Ok(())
}

/// The retry budget a client gave a manual retry (`config.max_retries`), if it did: 0 to 100.
pub fn retry_budget(max_retries: Option<&Value>) -> Result<Option<i32>, ManualRetryRefusal> {
    max_retries
        .map(|value| {
            value
                .as_i64()
                .filter(|n| (0..=100).contains(n))
                .map(|n| n as i32)
                .ok_or(ManualRetryRefusal::MaxRetriesOutOfRange)
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecutionStatus::*;
    use serde_json::json;

    const LIMITS: MonitorLimits = MonitorLimits {
        scheduling_timeout: Duration::from_secs(60),
        queue_ttl: Duration::from_secs(300),
        grace: Duration::from_secs(30),
    };

    #[test]
    fn what_the_monitor_does_by_status() {
        // (status, stuck after, what then, orphaned by a dead worker)
        let hand_back = Some(Recovery::HandBack);
        let unavailable = Recovery::Fail { kind: FailureKind::WorkerUnavailable, reason: "stuck in scheduling" };
        let stale = Recovery::Fail {
            kind: FailureKind::WorkerHeartbeatStale,
            reason: "its worker stopped heartbeating while it ran",
        };
        let table = [
            (Requested, None, None),
            (Scheduling, Some((Duration::from_secs(60), unavailable)), None),
            (Scheduled, Some((Duration::from_secs(330), Recovery::HandBack)), hand_back),
            (Running, None, Some(stale)),
            (Delayed, None, None),
            (Completed, None, None),
            (Failed, None, None),
            (Timeout, None, None),
            (Canceled, None, None),
            (Abandoned, None, None),
        ];
        assert_eq!(table.len(), ExecutionStatus::ALL.len());
        for (status, stuck, orphan) in table {
            assert_eq!(LIMITS.stuck(status), stuck, "{status}");
            assert_eq!(orphaned(status), orphan, "{status}");
            assert_eq!(STUCK_STATUSES.contains(&status), stuck.is_some(), "{status}");
            assert_eq!(HELD_BY_WORKER.contains(&status), orphan.is_some(), "{status}");
        }
        // what the monitor hands back goes back to waiting by an edge of the state machine
        for status in HELD_BY_WORKER {
            if orphaned(status) == hand_back {
                assert!(ExecutionStatus::can_transition(status, Requested), "{status}");
            }
        }
    }

    #[test]
    fn overdue_is_a_timeout_failure() {
        assert_eq!(
            OVERDUE,
            Recovery::Fail { kind: FailureKind::Timeout, reason: "still running well past its timeout" }
        );
        assert_eq!(FailureKind::Timeout.reported_status(), Timeout);
    }

    #[test]
    fn manual_retry_rules() {
        let base = ManualRetryRequest {
            parent_id: 7,
            parent_status: Failed,
            parent_action_ref: "core.echo",
            existing_retry: None,
            action_ref: None,
        };
        let cases: [(ManualRetryRequest, Result<(), ManualRetryRefusal>); 7] = [
            (base, Ok(())),
            (ManualRetryRequest { parent_status: Completed, ..base }, Ok(())),
            (ManualRetryRequest { parent_status: Abandoned, ..base }, Ok(())),
            (
                ManualRetryRequest { parent_status: Running, ..base },
                Err(ManualRetryRefusal::NotTerminal { id: 7, status: Running }),
            ),
            (
                ManualRetryRequest { existing_retry: Some(9), ..base },
                Err(ManualRetryRefusal::AlreadyRetried { id: 7, retry: 9 }),
            ),
            (ManualRetryRequest { action_ref: Some("core.echo"), ..base }, Ok(())),
            (
                ManualRetryRequest { action_ref: Some("core.fail"), ..base },
                Err(ManualRetryRefusal::OtherAction { id: 7, ran: "core.echo".into(), asked: "core.fail".into() }),
            ),
        ];
        for (request, expected) in cases {
            assert_eq!(manual_retry(&request), expected, "{request:?}");
        }
        // not terminal is said before already retried, and that before the other action
        let everything_wrong = ManualRetryRequest {
            parent_status: Running,
            existing_retry: Some(9),
            action_ref: Some("core.fail"),
            ..base
        };
        assert!(matches!(manual_retry(&everything_wrong), Err(ManualRetryRefusal::NotTerminal { .. })));
    }

    #[test]
    fn a_retry_budget_is_0_to_100() {
        let table = [
            (None, Ok(None)),
            (Some(json!(0)), Ok(Some(0))),
            (Some(json!(100)), Ok(Some(100))),
            (Some(json!(101)), Err(ManualRetryRefusal::MaxRetriesOutOfRange)),
            (Some(json!(-1)), Err(ManualRetryRefusal::MaxRetriesOutOfRange)),
            (Some(json!("3")), Err(ManualRetryRefusal::MaxRetriesOutOfRange)),
        ];
        for (given, expected) in table {
            assert_eq!(retry_budget(given.as_ref()), expected, "{given:?}");
        }
    }
}
