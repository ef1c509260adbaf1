//! Executing a prepared run: the action run by its runtime (or its outcome without running, when
//! it cannot run), and every secret value opened for it redacted from what it produced.

use std::path::PathBuf;

use attune_common::secrets::Redactor;

use super::prepare::Prepared;
use crate::Worker;
use crate::runner::{ActionRun, Ran};

/// `ran` with every value `redactor` knows taken out of its output, error and result.
pub(super) fn redacted(mut ran: Ran, redactor: &Redactor) -> Ran {
    if redactor.is_empty() {
        return ran;
    }
    ran.stdout = redactor.text(&ran.stdout);
    ran.stderr = redactor.text(&ran.stderr);
    ran.outcome.error = ran.outcome.error.map(|error| redactor.text(&error));
    if let Some(result) = ran.outcome.result.as_mut() {
        redactor.json(result);
    }
    ran
}

impl Worker {
    pub(super) async fn execute(&self, prepared: &Prepared<'_>) -> Ran {
        let ran = match &prepared.not_run {
            Some(outcome) => Ran::of(outcome.clone()),
            None => self.run_action(prepared).await,
        };
        match &prepared.opened {
            Some(opened) => redacted(ran, &opened.redactor),
            None => ran,
        }
    }

    /// The action run by its runtime.
    async fn run_action(&self, prepared: &Prepared<'_>) -> Ran {
        let claimed = &prepared.run;
        let run = ActionRun {
            execution_id: claimed.id,
            action_ref: &claimed.action_ref,
            runtime: prepared.runtime(),
            pack_path: PathBuf::from(claimed.pack_path.as_deref().unwrap_or_default()),
            entrypoint: claimed.entrypoint.as_deref().unwrap_or_default(),
            parameters: prepared.opened.as_ref().map_or(&claimed.parameters, |opened| &opened.parameters),
            timeout: prepared.timeout,
            retry_count: claimed.retry_count,
            output_limit: self.settings.output_limit,
            transient_exit_codes: &prepared.transient_exit_codes,
            http: claimed.http.as_ref(),
            idempotency_key: &claimed.idempotency_key,
            limits: claimed.limits.as_ref(),
            kill: Some(&prepared.kill),
            traceparent: prepared.traceparent.as_deref(),
            capture: prepared.live.as_ref().map(|live| &live.capture),
        };
        self.runtimes.execute(&run, &prepared.cancel).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::Outcome;
    use attune_common::mq::ResultStatus;
    use serde_json::json;

    #[test]
    fn what_a_run_produced_is_redacted_of_its_secrets_everywhere_it_is_recorded() {
        let opened = Redactor::new(vec!["hunter2-hunter2".into()]);
        let ran = Ran {
            outcome: Outcome {
                status: ResultStatus::Failed,
                failure_kind: None,
                error: Some("login hunter2-hunter2 refused".into()),
                result: Some(json!({"password": "hunter2-hunter2", "n": 1})),
            },
            exit_code: Some(1),
            stdout: "using hunter2-hunter2\n".into(),
            stderr: "hunter2-hunter2".into(),
            http_status: None,
            retry_after: None,
        };
        let ran = redacted(ran, &opened);
        let all = format!("{} {} {:?} {}", ran.stdout, ran.stderr, ran.outcome.error, ran.outcome.result.unwrap());
        assert!(!all.contains("hunter2"), "{all}");
        assert!(ran.stdout.starts_with("using "), "the rest is kept: {}", ran.stdout);
    }
}
