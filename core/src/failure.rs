//! Structured failure kinds. A failure is classified by the kind its reporter recorded, never by
//! searching a message's text.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// No eligible worker could take the execution.
    WorkerUnavailable,
    /// The execution expired in a worker's queue (message TTL) before it started.
    QueueTimeout,
    /// The worker running the execution stopped heartbeating.
    WorkerHeartbeatStale,
    /// The action said its failure is transient (exit code 75, EX_TEMPFAIL, or
    /// `{"attune": {"transient": true}}` on stdout).
    TransientError,
    /// An operator asked for a retry (recorded as the retry's reason).
    ManualRetry,
    ValidationError,
    PermissionDenied,
    ActionNotFound,
    InvalidParameters,
    /// The action itself failed (non-zero exit).
    ActionFailed,
    /// The action exceeded its own `timeout_seconds`; its retry policy decides.
    Timeout,
    /// The execution was canceled by a client.
    Canceled,
    /// An operator failed the execution by hand (`POST /executions/{id}/fail`): not retried.
    OperatorFailed,
    /// A message about the execution failed processing on every one of its deliveries and was
    /// dead-lettered (see `mq::DELIVERY_LIMIT`); not retried, as it would most likely fail again.
    PoisonMessage,
    /// The action passed one of its resource limits (memory, CPU time; see the action's
    /// `limits:`) and was killed: the action's fault, not the worker's; not retried by default,
    /// as the same run would most likely pass the same limit again.
    ResourceLimit,
}

use FailureKind::*;

impl FailureKind {
    pub const ALL: [FailureKind; 15] = [
        WorkerUnavailable,
        QueueTimeout,
        WorkerHeartbeatStale,
        TransientError,
        ManualRetry,
        ValidationError,
        PermissionDenied,
        ActionNotFound,
        InvalidParameters,
        ActionFailed,
        Timeout,
        Canceled,
        OperatorFailed,
        PoisonMessage,
        ResourceLimit,
    ];

    /// The kinds retried automatically when an action's policy does not say otherwise.
    pub const RETRIABLE_BY_DEFAULT: [FailureKind; 5] =
        [WorkerUnavailable, QueueTimeout, WorkerHeartbeatStale, TransientError, ManualRetry];

    pub fn is_retriable_by_default(self) -> bool {
        Self::RETRIABLE_BY_DEFAULT.contains(&self)
    }

    /// Kinds that say the platform lost the run (a worker or its supervisor gone, a dispatch that
    /// expired unstarted), not that the action failed: retried up to `retry::PLATFORM_RETRIES`
    /// times in a chain beyond the action's own `max_retries`, and never spending it.
    pub fn is_platform_loss(self) -> bool {
        matches!(self, WorkerUnavailable | QueueTimeout | WorkerHeartbeatStale)
    }

    /// Kinds no policy may retry: a person ended the execution on purpose.
    pub fn is_never_retried(self) -> bool {
        matches!(self, Canceled | OperatorFailed)
    }

    /// Whether a failure of this kind counts against the worker's health (its consecutive and
    /// total failures) rather than against the action: the worker could not start the action.
    pub fn counts_against_worker(self) -> bool {
        matches!(self, ActionNotFound | WorkerUnavailable)
    }

    /// The terminal status a failure of this kind is reported with: `timeout` for an action
    /// that ran out of time, `failed` for everything else.
    pub fn reported_status(self) -> crate::ExecutionStatus {
        match self {
            Timeout => crate::ExecutionStatus::Timeout,
            _ => crate::ExecutionStatus::Failed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerUnavailable => "worker_unavailable",
            QueueTimeout => "queue_timeout",
            WorkerHeartbeatStale => "worker_heartbeat_stale",
            TransientError => "transient_error",
            ManualRetry => "manual_retry",
            ValidationError => "validation_error",
            PermissionDenied => "permission_denied",
            ActionNotFound => "action_not_found",
            InvalidParameters => "invalid_parameters",
            ActionFailed => "action_failed",
            Timeout => "timeout",
            Canceled => "canceled",
            OperatorFailed => "operator_failed",
            PoisonMessage => "poison_message",
            ResourceLimit => "resource_limit",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_fault_and_reported_status_by_kind() {
        use crate::ExecutionStatus;
        // (kind, counts against the worker, reported status)
        let table = [
            (WorkerUnavailable, true, ExecutionStatus::Failed),
            (QueueTimeout, false, ExecutionStatus::Failed),
            (WorkerHeartbeatStale, false, ExecutionStatus::Failed),
            (TransientError, false, ExecutionStatus::Failed),
            (ManualRetry, false, ExecutionStatus::Failed),
            (ValidationError, false, ExecutionStatus::Failed),
            (PermissionDenied, false, ExecutionStatus::Failed),
            (ActionNotFound, true, ExecutionStatus::Failed),
            (InvalidParameters, false, ExecutionStatus::Failed),
            (ActionFailed, false, ExecutionStatus::Failed),
            (Timeout, false, ExecutionStatus::Timeout),
            (Canceled, false, ExecutionStatus::Failed),
            (OperatorFailed, false, ExecutionStatus::Failed),
            (PoisonMessage, false, ExecutionStatus::Failed),
            (ResourceLimit, false, ExecutionStatus::Failed),
        ];
        assert_eq!(table.len(), FailureKind::ALL.len(), "every kind has a row");
        for (kind, against_worker, status) in table {
            assert_eq!(kind.counts_against_worker(), against_worker, "{kind}");
            assert_eq!(kind.reported_status(), status, "{kind}");
        }
    }

    #[test]
    fn classification_table() {
        let retriable =
            ["worker_unavailable", "queue_timeout", "worker_heartbeat_stale", "transient_error", "manual_retry"];
        let not_retriable = [
            "validation_error",
            "permission_denied",
            "action_not_found",
            "invalid_parameters",
            "action_failed",
            "timeout",
            "canceled",
            "operator_failed",
            "poison_message",
            "resource_limit",
        ];
        for name in retriable {
            assert!(FailureKind::parse(name).unwrap().is_retriable_by_default(), "{name}");
        }
        for name in not_retriable {
            assert!(!FailureKind::parse(name).unwrap().is_retriable_by_default(), "{name}");
        }
        assert_eq!(retriable.len() + not_retriable.len(), FailureKind::ALL.len());
        let never: Vec<&str> = FailureKind::ALL.iter().filter(|k| k.is_never_retried()).map(|k| k.as_str()).collect();
        assert_eq!(never, ["canceled", "operator_failed"]);
    }

    #[test]
    fn names_match_serde() {
        for kind in FailureKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }
}
