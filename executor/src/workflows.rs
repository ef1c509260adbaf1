//! The workflow engine (ADR 0012): advances workflow runs, each step an ordinary execution.
//!
//! A run advances when PostgreSQL announces that one of its steps ended, or the run itself did
//! (`db::announcements::Announced::Workflow`), when it is waiting to start (its runtime,
//! `workflow`, announced like any other), and at a sweep every `SWEEP` of every running run,
//! which covers whatever an announcement missed (an executor that was down, a lost listening
//! connection).
//!
//! One advance is one transaction holding the run's row lock: it reads the pinned definition,
//! the latest attempt of each step item, asks `attune_core::workflow::plan` what to start and
//! whether the run is over, and makes the items to start through `workflow_step_start`, whose
//! unique key lets an item start only once. The plan is a function of the record alone, so an
//! advance that is repeated, raced by another executor, or cut off by a crash before its commit
//! decides the same again: no step is lost, none starts twice, a join waits for every item.
//!
//! A run ended by a client (cancel, fail), by its timeout or by its last step has its steps
//! that are still unfinished canceled, and the workers running them told to stop. A run that
//! is paused (`pause` of kind `run`, its id), or whose workflow or the `workflow` runtime is,
//! starts no new step until it is resumed; what runs, runs on.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attune_common::db::{self, execution::Outcome, execution::Transition};
use attune_core::params::{self, ParamSpecs};
use attune_core::workflow::{self, WorkflowSpec};
use attune_core::{ExecutionStatus, FailureKind};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::Context;

/// Every running run is looked at this often, announced or not.
const SWEEP: Duration = Duration::from_secs(2);
/// Most runs taken from the record at one look.
const BATCH: i64 = 500;

/// The runs to advance, marked by announcements, and the engine's wake-up.
#[derive(Default)]
pub struct Marks {
    marked: Mutex<Marked>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Marked {
    runs: BTreeSet<i64>,
    /// Runs may be waiting to start.
    waiting: bool,
    /// Announcements may have been missed: sweep now.
    all: bool,
}

impl Marks {
    /// A step of run `id` ended, or the run did.
    pub fn run(&self, id: i64) {
        self.marked.lock().expect("workflow marks poisoned").runs.insert(id);
        self.wake.notify_one();
    }

    /// A run may be waiting to start.
    pub fn waiting(&self) {
        self.marked.lock().expect("workflow marks poisoned").waiting = true;
        self.wake.notify_one();
    }

    /// Announcements may have been lost.
    pub fn all(&self) {
        self.marked.lock().expect("workflow marks poisoned").all = true;
        self.wake.notify_one();
    }

    fn take(&self) -> Marked {
        std::mem::take(&mut *self.marked.lock().expect("workflow marks poisoned"))
    }
}

/// The engine's loop, until `shutdown` fires.
pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    let mut definitions: HashMap<String, Arc<WorkflowSpec>> = HashMap::new();
    let mut last_sweep: Option<Instant> = None;
    loop {
        let sweep_at = last_sweep.map_or_else(Instant::now, |at| at + SWEEP);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = context.workflows.wake.notified() => {}
            _ = tokio::time::sleep_until(sweep_at.into()) => {}
        }
        let marked = context.workflows.take();
        let mut runs = marked.runs;
        let sweep = marked.all || last_sweep.is_none_or(|at| at.elapsed() >= SWEEP);
        let looked: Result<(), crate::Error> = async {
            if marked.waiting || sweep {
                runs.extend(db::workflow::waiting(&context.db, BATCH).await?);
            }
            if sweep {
                last_sweep = Some(Instant::now());
                runs.extend(db::workflow::to_sweep(&context.db, BATCH).await?);
            }
            Ok(())
        }
        .await;
        if let Err(e) = looked {
            tracing::warn!(error = %e, "looking for workflow runs failed; looking again at the next sweep");
        }
        for id in runs {
            if shutdown.is_cancelled() {
                return;
            }
            if let Err(e) = advance(&context, &mut definitions, id).await {
                // the run is looked at again at the next sweep
                tracing::warn!(workflow_run = id, error = %e, "advancing a workflow run failed");
            }
        }
    }
}

/// One advance of run `id` (see the module's documentation).
pub async fn advance(
    context: &Context,
    definitions: &mut HashMap<String, Arc<WorkflowSpec>>,
    id: i64,
) -> Result<(), crate::Error> {
    let mut tx = db::workflow::begin_advance(&context.db).await?;
    let Some((run, paused)) = db::workflow::lock(&mut *tx, id).await? else {
        drop(tx);
        return without_definition(context, id).await;
    };
    let Some(execution) = db::execution::get(&mut *tx, id).await? else {
        return Ok(());
    };
    match execution.status {
        status if status.is_terminal() => {
            drop(tx);
            return stop_steps(context, id, status).await;
        }
        ExecutionStatus::Requested => {
            if paused {
                return Ok(());
            }
            // (through `scheduled`, the state machine's way to `running`, in one transaction:
            // nobody sees it scheduled, and no worker is named)
            let to_scheduled = Transition::to(ExecutionStatus::Scheduled).from(&[ExecutionStatus::Requested]);
            let to_running = Transition::to(ExecutionStatus::Running).from(&[ExecutionStatus::Scheduled]);
            if db::execution::transition_brief(&mut *tx, id, &to_scheduled).await?.is_none()
                || db::execution::transition_brief(&mut *tx, id, &to_running).await?.is_none()
            {
                return Ok(());
            }
            tracing::info!(workflow_run = id, workflow = %execution.action_ref, "workflow run started");
        }
        ExecutionStatus::Running => {}
        // a retry waiting out its backoff: the retry timer makes it a request when it is due
        _ => return Ok(()),
    }
    let spec = match definitions.get(&run.definition) {
        Some(spec) => spec.clone(),
        None => {
            let stored = db::workflow::definition(&mut *tx, &run.definition).await?;
            let Some(spec) = stored.and_then(|value| serde_json::from_value::<WorkflowSpec>(value).ok()) else {
                tx.commit().await?;
                let error = format!("the definition {} it pinned cannot be read", run.definition);
                return fail_run(context, id, error).await;
            };
            let spec = Arc::new(spec);
            definitions.insert(run.definition.clone(), spec.clone());
            spec
        }
    };
    // (most runs resume none: no read for them)
    let resumed = match run.resumes {
        Some(_) => db::workflow::resumed(&mut *tx, id).await?,
        None => Vec::new(),
    };
    let attempts = db::workflow::attempts(&mut tx, id, &resumed, &spec.main_steps()).await?;
    let plan = workflow::plan(&spec, &execution.parameters, &attempts);
    let mut again = false;
    if !plan.start.is_empty() && !paused {
        let default_timeout = context.settings.common.default_timeout_secs;
        for start in &plan.start {
            let (parameters, failure) = match checked_parameters(context, start).await? {
                Ok(parameters) => (parameters, None),
                Err(reason) => (start.parameters.clone(), Some(reason)),
            };
            let made = db::workflow::start_step(
                &mut *tx,
                id,
                &start.step,
                start.item,
                &parameters,
                failure.as_deref(),
                default_timeout,
            )
            .await?;
            // an item recorded failed at once announces nothing: look again
            again |= made.is_some() && failure.is_some();
        }
    }
    tx.commit().await?;
    if let Some(finish) = plan.finish {
        finish_run(context, &execution, finish).await?;
    }
    if again {
        context.workflows.run(id);
    }
    Ok(())
}

/// A start's parameters held to its action's declared ones, defaults filled in; `Err` names the
/// parameter and what is wrong. A secret parameter takes only a stored secret's reference: the
/// executors cannot seal a value (they hold no key).
async fn checked_parameters(context: &Context, start: &workflow::Start) -> Result<Result<Value, String>, crate::Error> {
    let Some(action) = context.actions.get_by_ref(&context.db, &start.action).await? else {
        // made without its action: the scheduler fails it as `action_not_found`
        return Ok(Ok(start.parameters.clone()));
    };
    let specs: ParamSpecs = serde_json::from_value(action.parameters.clone()).unwrap_or_default();
    let given = start.parameters.as_object().cloned().unwrap_or_default();
    Ok(match params::validate(&specs, &given) {
        Ok(resolved) => match specs.iter().find(|(name, spec)| {
            spec.secret && resolved.get(*name).is_some_and(|v| params::secret_reference(v).is_none())
        }) {
            Some((name, _)) => Err(format!(
                "parameter '{name}': is secret, and a workflow passes a secret only as a stored secret's reference \
                 ({{\"$secret\": NAME}})"
            )),
            None => Ok(Value::Object(resolved)),
        },
        Err(e) => Err(e.to_string()),
    })
}

async fn finish_run(
    context: &Context,
    execution: &db::execution::Execution,
    finish: workflow::Finish,
) -> Result<(), crate::Error> {
    if finish.succeeded {
        let outcome = Outcome { result: finish.result, ..Default::default() };
        let complete = Transition::to(ExecutionStatus::Completed).from(&[ExecutionStatus::Running]).outcome(&outcome);
        if db::execution::transition_brief(&context.db, execution.id, &complete).await?.is_some() {
            tracing::info!(workflow_run = execution.id, workflow = %execution.action_ref, "workflow run completed");
        }
        return Ok(());
    }
    let error = finish.error.unwrap_or_else(|| "a step failed".into());
    let outcome =
        Outcome { failure_kind: Some(FailureKind::ActionFailed), error: Some(error.clone()), ..Default::default() };
    let recorded = context
        .retry_manager
        .record_failure(execution, ExecutionStatus::Failed, &[ExecutionStatus::Running], None, &outcome)
        .await?;
    if recorded.is_some() {
        tracing::warn!(workflow_run = execution.id, workflow = %execution.action_ref, error, "workflow run failed");
    }
    Ok(())
}

async fn fail_run(context: &Context, id: i64, error: String) -> Result<(), crate::Error> {
    let outcome = Outcome { failure_kind: Some(FailureKind::ActionNotFound), error: Some(error), ..Default::default() };
    let fail = Transition::to(ExecutionStatus::Failed)
        .from(&[ExecutionStatus::Requested, ExecutionStatus::Running])
        .outcome(&outcome);
    db::execution::transition_brief(&context.db, id, &fail).await?;
    Ok(())
}

/// A workflow execution without its row: its action had no definition when it was made.
async fn without_definition(context: &Context, id: i64) -> Result<(), crate::Error> {
    let Some(execution) = db::execution::get(&context.db, id).await? else { return Ok(()) };
    if execution.status.is_terminal() || execution.runtime.as_deref() != Some(workflow::RUNTIME) {
        return Ok(());
    }
    fail_run(context, id, format!("workflow '{}' had no definition when the run was made", execution.action_ref)).await
}

/// The steps of ended run `id` that have not finished are canceled, and their workers told.
async fn stop_steps(context: &Context, id: i64, ended: ExecutionStatus) -> Result<(), crate::Error> {
    let error = format!("its workflow run {id} ended ({ended})");
    let outcome = Outcome { failure_kind: Some(FailureKind::Canceled), error: Some(error), ..Default::default() };
    let cancel = Transition::to(ExecutionStatus::Canceled).outcome(&outcome);
    for (step, worker) in db::workflow::unfinished_steps(&context.db, id).await? {
        if db::execution::transition_brief(&context.db, step, &cancel).await?.is_some() && worker.is_some() {
            context.publisher.send_cancel_notice(step).await;
        }
    }
    Ok(())
}
