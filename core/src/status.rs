//! The execution state machine: every status, which are terminal, and which edges exist.
//!
//! This is the one place the allowed transitions are written down. The repository's guarded
//! UPDATE (`db::execution::transition`) takes its `from` sets from here, and
//! `docs/state-machine.md` draws the same graph.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "execution_status", rename_all = "snake_case"))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Requested,
    Scheduling,
    Scheduled,
    Running,
    Completed,
    Failed,
    Timeout,
    Canceled,
    Abandoned,
    Delayed,
}

use ExecutionStatus::*;

impl ExecutionStatus {
    pub const ALL: [ExecutionStatus; 10] =
        [Requested, Scheduling, Scheduled, Running, Completed, Failed, Timeout, Canceled, Abandoned, Delayed];
    pub const TERMINAL: [ExecutionStatus; 5] = [Completed, Failed, Timeout, Canceled, Abandoned];
    /// Dispatched to a worker and not finished: what counts against its slots and queue depth.
    pub const IN_FLIGHT: [ExecutionStatus; 2] = [Scheduled, Running];
    /// Not finished yet: waiting, delayed, being scheduled, dispatched or running.
    pub const UNFINISHED: [ExecutionStatus; 5] = [Requested, Scheduling, Scheduled, Running, Delayed];
    /// Unfinished and not started: waiting, placed, or delayed for a retry's backoff.
    pub const NOT_STARTED: [ExecutionStatus; 4] = [Requested, Scheduling, Scheduled, Delayed];

    pub fn is_terminal(self) -> bool {
        Self::TERMINAL.contains(&self)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Requested => "requested",
            Scheduling => "scheduling",
            Scheduled => "scheduled",
            Running => "running",
            Completed => "completed",
            Failed => "failed",
            Timeout => "timeout",
            Canceled => "canceled",
            Abandoned => "abandoned",
            Delayed => "delayed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// The states an execution may move to `self` from. Canceled is reachable from every
    /// non-terminal state; a retry is a new row, so no terminal state has an outgoing edge.
    pub fn allowed_from(self) -> &'static [ExecutionStatus] {
        match self {
            // the retry timer promotes a due delayed retry; work that never started goes back
            // to waiting (a dispatch that could not be sent, a stopping worker's hand-back, a
            // dispatch lost with its queue), without spending a retry. `scheduling → requested`
            // stays allowed for rows an earlier version left claimed; nothing here takes it
            Requested => &[Delayed, Scheduling, Scheduled],
            // written only by earlier versions (a claim, and a redelivered request finding it);
            // kept so that their rows stay valid
            Scheduling => &[Requested, Scheduling],
            // an executor claims waiting requests for the workers with free slots (one write);
            // `scheduling → scheduled` was an earlier version's assignment after its claim
            Scheduled => &[Requested, Scheduling],
            Running => &[Scheduled],
            Completed => &[Running],
            // the executor fails what it cannot schedule (and, through its RetryManager, what a
            // worker could not start), the DLQ handler what expired in a worker queue, the
            // monitor an earlier version's stuck claim
            Failed => &[Requested, Scheduling, Scheduled, Running],
            Timeout => &[Running],
            Canceled => &[Requested, Scheduling, Scheduled, Running, Delayed],
            Abandoned => &[Scheduled, Running],
            Delayed => &[],
        }
    }

    pub fn can_transition(from: ExecutionStatus, to: ExecutionStatus) -> bool {
        to.allowed_from().contains(&from)
    }
}

impl std::fmt::Display for ExecutionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_have_no_outgoing_edges() {
        for from in ExecutionStatus::TERMINAL {
            for to in ExecutionStatus::ALL {
                assert!(!ExecutionStatus::can_transition(from, to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn every_non_terminal_state_can_be_canceled() {
        assert_eq!(
            ExecutionStatus::UNFINISHED.to_vec(),
            ExecutionStatus::ALL.into_iter().filter(|s| !s.is_terminal()).collect::<Vec<_>>()
        );
        for from in ExecutionStatus::UNFINISHED {
            assert!(ExecutionStatus::can_transition(from, Canceled), "{from}");
        }
    }

    #[test]
    fn the_happy_path_is_allowed_and_skipping_is_not() {
        let path = [Requested, Scheduling, Scheduled, Running, Completed];
        for pair in path.windows(2) {
            assert!(ExecutionStatus::can_transition(pair[0], pair[1]));
        }
        assert!(!ExecutionStatus::can_transition(Requested, Running));
        assert!(!ExecutionStatus::can_transition(Scheduled, Completed));
        assert!(!ExecutionStatus::can_transition(Delayed, Scheduled));
        assert!(ExecutionStatus::can_transition(Delayed, Requested));
    }

    #[test]
    fn names_round_trip_and_match_serde() {
        for status in ExecutionStatus::ALL {
            assert_eq!(ExecutionStatus::parse(status.as_str()), Some(status));
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        assert_eq!(ExecutionStatus::parse("done"), None);
    }
}
