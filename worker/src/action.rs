//! An action's run as a runtime takes it (`ActionRun`) and what it gives back (`Ran`, with its
//! `Outcome`), whichever runtime runs it: a process (`crate::runner`), a request
//! (`crate::http`) or a builtin.

use std::path::PathBuf;
use std::time::Duration;

use attune_common::mq::ResultStatus;
use attune_core::FailureKind;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub struct ActionRun<'a> {
    pub execution_id: i64,
    pub action_ref: &'a str,
    pub runtime: &'a str,
    pub pack_path: PathBuf,
    pub entrypoint: &'a str,
    pub parameters: &'a Value,
    pub timeout: Duration,
    pub retry_count: i32,
    pub output_limit: usize,
    /// Exit codes the action's retry policy treats as transient (besides 75).
    pub transient_exit_codes: &'a [i32],
    /// The request of an `http` action (`attune_core::pack::HttpSpec` as JSON).
    pub http: Option<&'a Value>,
    /// The retry chain's idempotency key.
    pub idempotency_key: &'a str,
    /// The action's `limits:` block as stored (`action.limits`); the worker fills in and caps
    /// what it enforces (`crate::supervise::limits_for`).
    pub limits: Option<&'a Value>,
    /// When it fires, a process action's group is SIGKILLed at once, without the grace a cancel
    /// or a timeout gives it (the worker's lease ran out: docs/adr/0008).
    pub kill: Option<&'a CancellationToken>,
    /// The W3C `traceparent` of the worker's `run` span when traces are on: `TRACEPARENT` to a
    /// process action, the `traceparent` header of an `http` action's request.
    pub traceparent: Option<&'a str>,
    /// Where a process action's readers keep its output, shared with its followers
    /// (`crate::live`); none: a capture of the run's own.
    pub capture: Option<&'a std::sync::Arc<crate::live::Capture>>,
}

/// The reported outcome of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: ResultStatus,
    pub failure_kind: Option<FailureKind>,
    pub error: Option<String>,
    pub result: Option<Value>,
}

/// How a run ended, whatever its runtime: what its result reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The status of an `http` action's response, if one came.
    pub http_status: Option<i32>,
    /// The wait a `Retry-After` header asked for.
    pub retry_after: Option<Duration>,
}

impl Ran {
    /// An outcome with nothing else to report.
    pub fn of(outcome: Outcome) -> Self {
        Ran {
            outcome,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            http_status: None,
            retry_after: None,
        }
    }
}
