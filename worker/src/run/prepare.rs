//! Preparing a claimed run: its `run` span, its secrets opened for it alone, its live output
//! made followable, and its start registered (a cancel notice stops it from here on). What
//! cannot be prepared (its action gone, its secrets unopened) becomes its outcome: it is not run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use attune_common::db::execution::worker::ClaimedRun;
use attune_common::mq::ResultStatus;
use attune_common::secrets::{Opened, Unopened};
use attune_common::trace::{self, Span};
use attune_core::FailureKind;
use tokio_util::sync::CancellationToken;

use super::claim::Claim;
use crate::Worker;
use crate::live::LiveRun;
use crate::record::transient_exit_codes;
use crate::runner;
use crate::slots::Started;

/// A run ready to execute.
pub(super) struct Prepared<'a> {
    pub(super) run: ClaimedRun,
    pub(super) run_token: String,
    /// Its duration counts from here.
    pub(super) since: Instant,
    pub(super) span: Span,
    /// The `run` span's context, handed to the action.
    pub(super) traceparent: Option<String>,
    /// Stops it (a cancel notice, the drain deadline).
    pub(super) cancel: CancellationToken,
    /// Kills its process group at once (the lease ran out).
    pub(super) kill: CancellationToken,
    pub(super) transient_exit_codes: Vec<i32>,
    pub(super) timeout: Duration,
    /// Its parameters with their secrets opened, and what redacts them.
    pub(super) opened: Option<Opened>,
    /// Its outcome without running, when it cannot run (`not_run`).
    pub(super) not_run: Option<runner::Outcome>,
    /// Its output as followers see it, for a process run.
    pub(super) live: Option<Arc<LiveRun>>,
    /// Registered as running here until dropped.
    pub(super) running: Started<'a>,
}

impl Prepared<'_> {
    pub(super) fn runtime(&self) -> &str {
        self.run.runtime.as_deref().unwrap_or_default()
    }
}

/// The outcome of a run that cannot run: its action is gone, or its secrets cannot be opened.
pub(super) fn not_run(action_ref: &str, action_gone: bool, unopened: Option<Unopened>) -> Option<runner::Outcome> {
    let (failure_kind, error) = match (action_gone, unopened) {
        (true, _) => (FailureKind::ActionNotFound, format!("action '{action_ref}' no longer exists")),
        (false, Some(Unopened::Invalid(error))) => (FailureKind::InvalidParameters, error),
        (false, Some(Unopened::Unavailable(error))) => (FailureKind::TransientError, error),
        (false, None) => return None,
    };
    Some(runner::Outcome {
        status: ResultStatus::Failed,
        failure_kind: Some(failure_kind),
        error: Some(error),
        result: None,
    })
}

impl Worker {
    /// `dispatched`: the trace context the dispatch message names for it.
    pub(super) async fn prepare<'a>(&'a self, claim: Claim<'a>, dispatched: Option<String>) -> Prepared<'a> {
        let Claim { run, run_token, reserved } = claim;
        let execution_id = run.id;
        let since = Instant::now();
        // the `run` span (when traces are on): under the executor's `dispatch` span when the
        // message names one in the execution's own trace (the row's; a message does not choose
        // it), else under the row's; the action gets its context
        let mut span = Span::default();
        if trace::on() {
            let row = run.trace_parent.as_deref().and_then(trace::valid);
            let parent = match (dispatched, row) {
                (Some(sent), Some(row)) if trace::same_trace(&sent, &row) => Some(sent),
                (Some(sent), None) => Some(sent),
                (_, row) => row,
            };
            span = trace::span("run", trace::Kind::Consumer, Some(execution_id), parent.as_deref());
            span.attribute("attune.worker_id", self.id);
            span.attribute("attune.action", run.action_ref.clone());
        }
        let traceparent = span.traceparent();
        // secrets referred to or sealed among the parameters, opened for this run alone; every
        // value opened is redacted from what the run produced before it is recorded
        let opened = attune_common::secrets::open(
            &self.db,
            self.settings.sealer.as_ref(),
            execution_id,
            &run.action_ref,
            &run.parameters,
        )
        .await;
        let (opened, unopened) = match opened {
            Ok(opened) => (opened, None),
            Err(error) => (None, Some(error)),
        };
        let not_run = not_run(&run.action_ref, run.runtime.is_none(), unopened);
        // a process run is followable while it runs (`live`): its output readers keep what they
        // read where a follow request finds it (a builtin or http action has no output meanwhile)
        let runtime = run.runtime.as_deref().unwrap_or_default();
        let live = (!matches!(runtime, "builtin" | "http")).then(|| {
            let output_limit = crate::supervise::limits_for(run.limits.as_ref(), self.settings.output_limit)
                .map_or(self.settings.output_limit, |limits| {
                    usize::try_from(limits.output_bytes).unwrap_or(usize::MAX)
                });
            let redactor = opened.as_ref().map(|opened| opened.redactor.clone());
            let live = LiveRun::new(execution_id, redactor, output_limit);
            self.live.lock().expect("live map poisoned").insert(execution_id, live.clone());
            live
        });
        let timeout_seconds = run.timeout_seconds.unwrap_or(self.settings.common.default_timeout_secs);
        let (cancel, kill) = (self.abort.child_token(), CancellationToken::new());
        let running = reserved.start(&cancel, &kill);
        Prepared {
            transient_exit_codes: transient_exit_codes(run.retry_policy.as_ref()),
            timeout: Duration::from_secs(timeout_seconds.max(1) as u64),
            run,
            run_token,
            since,
            span,
            traceparent,
            cancel,
            kill,
            opened,
            not_run,
            live,
            running,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_whose_action_is_gone_or_whose_secrets_do_not_open_is_not_run_and_says_why() {
        let invalid = || Some(Unopened::Invalid("secret 'db' is not set".into()));
        let unavailable = || Some(Unopened::Unavailable("the secrets store could not be read".into()));
        let kind =
            |outcome: Option<runner::Outcome>| outcome.map(|o| (o.status, o.failure_kind.unwrap(), o.error.unwrap()));
        assert_eq!(kind(not_run("core.echo", false, None)), None);
        assert_eq!(
            kind(not_run("core.echo", true, invalid())),
            Some((ResultStatus::Failed, FailureKind::ActionNotFound, "action 'core.echo' no longer exists".into())),
            "a gone action goes first: there is nothing to open secrets for"
        );
        assert_eq!(
            kind(not_run("core.echo", false, invalid())),
            Some((ResultStatus::Failed, FailureKind::InvalidParameters, "secret 'db' is not set".into()))
        );
        assert_eq!(
            kind(not_run("core.echo", false, unavailable())),
            Some((ResultStatus::Failed, FailureKind::TransientError, "the secrets store could not be read".into()))
        );
    }
}
