//! The RetryManager: records a failure and, when the retry policy says so, the retry that follows
//! it, in one transaction. The retry is a new execution (`delayed` until `not_before`, linked by
//! `original_execution`); the retry timer turns it into a request when it is due. The unique index
//! on `original_execution` and the guarded transition make a redelivered failure harmless.

use attune_common::db::{
    self, execution::Execution, execution::NewExecution, execution::Outcome, execution::Transition,
};
use attune_common::metrics;
use attune_common::pack::RetryPolicy;
use attune_core::retry::{self, EffectivePolicy, FailedAttempt, RetryDecision, RetrySettings};
use attune_core::{ExecutionStatus, FailureKind};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

pub struct RetryManager {
    pool: PgPool,
    config: RetrySettings,
}

#[derive(Debug)]
pub struct Recorded {
    pub execution: Execution,
    pub decision: RetryDecision,
    pub retry: Option<Execution>,
}

impl RetryManager {
    /// With the quick reference's `RetryConfig` literal, or the executor's `RetrySettings`.
    pub fn new(pool: PgPool, config: impl Into<RetrySettings>) -> Self {
        RetryManager { pool, config: config.into() }
    }

    pub fn config(&self) -> &RetrySettings {
        &self.config
    }

    /// The circuit of the execution's action after this failure, evaluated and stored in `tx`
    /// (with its row locked), when the policy has a circuit breaker: the end of the open period
    /// that holds a retry back, if the circuit is not closed.
    async fn circuit(
        &self,
        tx: &mut sqlx::PgConnection,
        policy: &EffectivePolicy,
        current: &Execution,
        failure: FailureKind,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        use attune_core::circuit::{self, Window};
        let (Some(spec), Some(action)) = (&policy.circuit, current.action) else {
            return Ok(None);
        };
        if !circuit::counts(failure) {
            let held = db::circuit::get(&mut *tx, action).await?.and_then(|c| c.held_until(spec, now));
            return Ok(held);
        }
        let before = db::circuit::lock(&mut *tx, action).await?;
        let counted =
            db::circuit::window(&mut *tx, &current.action_ref, circuit::window_start(spec, &before, now)).await?;
        // this failure is not written yet: count it
        let window = Window { finished: counted.finished + 1, failed: counted.failed + 1 };
        let after = circuit::after_failure(spec, &before, window, current.id, now);
        db::circuit::store(&mut *tx, action, &before, &after, window).await?;
        if after.state != before.state || after.open_until != before.open_until {
            tracing::warn!(
                action = %current.action_ref,
                state = after.state.as_str(),
                open_until = ?after.open_until,
                finished = window.finished,
                failed = window.failed,
                "circuit {}",
                if after.state == circuit::CircuitState::Open { "opened" } else { "changed" }
            );
        }
        Ok(after.held_until(spec, now))
    }

    /// The effective policy of the execution's action; for a workflow step whose definition
    /// gives a `retry:` block, the action's with the step's fields over it.
    async fn policy(&self, current: &Execution) -> Result<EffectivePolicy, sqlx::Error> {
        let mut stored: Option<Value> = match current.action {
            Some(action) => db::action::retry_policy(&self.pool, action).await?,
            None => None,
        };
        if let Some(Value::Object(step)) = current.config.get("step_retry") {
            let mut merged = match stored {
                Some(Value::Object(action)) => action,
                _ => serde_json::Map::new(),
            };
            merged.extend(step.clone());
            stored = Some(Value::Object(merged));
        }
        let policy: Option<RetryPolicy> = stored.and_then(|v| serde_json::from_value(v).ok());
        Ok(EffectivePolicy::resolve(&self.config, policy.as_ref()))
    }

    /// Records `current` as failed (`reported` is `failed` or `timeout`) with `outcome`, guarded by
    /// `from` and `owned_by`, and creates its retry when the policy says so. `Ok(None)`: the
    /// transition missed (a duplicate or stale report); nothing was written.
    pub async fn record_failure(
        &self,
        current: &Execution,
        reported: ExecutionStatus,
        from: &[ExecutionStatus],
        owned_by: Option<i64>,
        outcome: &Outcome,
    ) -> Result<Option<Recorded>, sqlx::Error> {
        self.record(current, reported, from, owned_by, None, outcome).await
    }

    /// `record_failure` for a worker's result: `running` on `worker_id`, and guarded by the run
    /// token the result carries too (`Transition::run_token`), so a forged result misses.
    pub async fn record_reported_failure(
        &self,
        current: &Execution,
        reported: ExecutionStatus,
        worker_id: i64,
        run_token: Option<&str>,
        outcome: &Outcome,
    ) -> Result<Option<Recorded>, sqlx::Error> {
        let from = [ExecutionStatus::Running];
        self.record(current, reported, &from, Some(worker_id), Some(run_token), outcome).await
    }

    async fn record(
        &self,
        current: &Execution,
        reported: ExecutionStatus,
        from: &[ExecutionStatus],
        owned_by: Option<i64>,
        run_token: Option<Option<&str>>,
        outcome: &Outcome,
    ) -> Result<Option<Recorded>, sqlx::Error> {
        let failure = outcome.failure_kind.unwrap_or(FailureKind::ActionFailed);
        let policy = self.policy(current).await?;
        let mut tx = self.pool.begin().await?;
        let now: DateTime<Utc> = db::now(&mut *tx).await?;
        // a report the transition below misses rolls this back with the rest
        let held_until = self.circuit(&mut tx, &policy, current, failure, now).await?;
        let attempt = FailedAttempt {
            exit_code: outcome.exit_code.or(current.exit_code),
            http_status: outcome.http_status.or(current.http_status),
            result: outcome.result.clone().or_else(|| current.result.clone()),
            retry_after: outcome
                .retry_after
                .and_then(|after| chrono::Duration::from_std(after).ok())
                .map(|after| now + after),
            held_until,
            platform_retries: i32::try_from(db::execution::platform_retries(&current.config)).unwrap_or(i32::MAX),
            ..FailedAttempt::new(
                failure,
                current.retry_count,
                current.max_retries.unwrap_or(0),
                current.started.is_some(),
            )
        };
        let decision = retry::decide(&policy, &attempt, now, &mut rand::rng());
        let record = serde_json::to_value(retry::DecisionRecord::new(&policy, &attempt, &decision, now))
            .expect("a decision record serializes");
        let status = retry::recorded_status(&decision, reported);
        let from: Vec<ExecutionStatus> =
            from.iter().copied().filter(|f| ExecutionStatus::can_transition(*f, status)).collect();
        let mut transition = Transition::to(status).from(&from).outcome(outcome).retry_decision(&record);
        if let Some(worker) = owned_by {
            transition = transition.owned_by(worker);
        }
        if let Some(run_token) = run_token {
            transition = transition.run_token(run_token);
        }
        let Some(execution) = db::execution::transition(&mut *tx, current.id, &transition).await? else {
            return Ok(None);
        };
        let retry = match &decision {
            RetryDecision::Retry { at, reason, paid_by_platform, .. } => {
                let mut new = NewExecution::retry_of(&execution, ExecutionStatus::Delayed, *reason, None, Some(*at));
                if *paid_by_platform {
                    new = new.paid_by_platform(&execution);
                }
                Some(db::execution::insert_retry(&mut *tx, &new).await?)
            }
            RetryDecision::GiveUp(_) => None,
        };
        tx.commit().await?;
        metrics::increment(&metrics::FAILURES, &[("failure_kind", failure.as_str())], 1);
        match (&decision, &retry) {
            (RetryDecision::Retry { delay, reason, .. }, Some(retry)) => {
                metrics::increment(&metrics::RETRIES_CREATED, &[("reason", reason.as_str())], 1);
                tracing::info!(
                    execution_id = execution.id,
                    retry_execution_id = retry.id,
                    attempt = retry.retry_count,
                    reason = %reason,
                    delay_ms = delay.as_millis() as u64,
                    "retry scheduled"
                )
            }
            (RetryDecision::GiveUp(why), _) => tracing::info!(
                execution_id = execution.id,
                status = %execution.status,
                failure_kind = %failure,
                "not retried: {why}"
            ),
            _ => {}
        }
        Ok(Some(Recorded { execution, decision, retry }))
    }
}
