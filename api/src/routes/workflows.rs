//! `GET /workflows/{id}`: a workflow run as a graph. Each step with its state (as the executors'
//! planner sees it, from the same record: `attune_core::workflow::plan`), what it needs, its
//! items, how many executions it made and when, and a page of them (each attempt of each item,
//! with its status, timing, error and result; `?step=NAME&after=ID` pages on through one step's).
//! One snapshot: a step's result and what the run made of it are read together.
//!
//! A page, not every execution: a fan-out of 10,000 items answered each of them, 3.2 MB that
//! took the server 75 ms and its client as long again to read, where a reader wants the counts
//! (`items`, `attempts`) and the first few.

use std::collections::BTreeMap;

use attune_common::db::{self, execution::Execution, workflow::StepExecution};
use attune_core::workflow::{self, ItemState, Phase, StepState, WorkflowSpec};
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ApiError;

/// Executions shown per step unless `limit` says otherwise, and the most it may say.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 10_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct GraphQuery {
    /// Only this step (its name), with its executions from `after` on
    #[param(min_length = 1, max_length = 255)]
    pub step: Option<String>,
    /// Executions with ids above this one (a step's `next_after`; with `step`, that step's)
    pub after: Option<i64>,
    /// At most this many executions per step (1 to 10000; 100 by default), and no more than
    /// `ATTUNE_API_LIST_BUDGET_BYTES` of them in all (then `next_after` says where the rest start)
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<i64>,
}

/// A workflow run and its steps.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkflowRun {
    /// The run's own execution (its status is the run's; its `result` the workflow's result).
    pub run: Execution,
    /// The hash of the definition the run pinned when it was made.
    pub definition: String,
    /// The run this one retries: the steps that run completed are not run again.
    pub resumes: Option<i64>,
    /// When an executor last advanced the run (looked at its steps and made what was due).
    pub advanced: Option<DateTime<Utc>>,
    /// The steps in the order written: main, then on-failure.
    pub steps: Vec<Step>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Step {
    pub name: String,
    pub action: String,
    /// `main` or `on-failure`.
    #[schema(value_type = String)]
    pub phase: Phase,
    /// `waiting`, `running`, `succeeded`, `failed`, `skipped` or `not_run`.
    #[schema(value_type = String)]
    pub state: StepState,
    /// The steps it starts after.
    pub needs: Vec<String>,
    /// For a `with-items` step whose list is known: how many items are where.
    #[schema(value_type = Option<Object>)]
    pub items: Option<ItemState>,
    /// Why it was skipped, or failed with no execution of its own.
    pub reason: Option<String>,
    /// Executions made for it, every attempt of every item.
    pub attempts: usize,
    /// When its first execution was made, and when its last one finished (once it is over).
    pub started: Option<DateTime<Utc>>,
    pub finished: Option<DateTime<Utc>>,
    /// A page of its executions, by id (the first `limit`, or those after `after`).
    pub executions: Vec<StepExecution>,
    /// Where the step's next page starts (`?step=NAME&after=...`); null when this one is its last.
    pub next_after: Option<i64>,
}

#[utoipa::path(get, path = "/workflows/{id}", operation_id = "get_workflow_run", tag = "workflows",
    params(("id" = i64, Path, description = "The workflow run's execution id"), GraphQuery),
    responses(
        (status = 200, description = "The run and each of its steps", body = WorkflowRun),
        (status = 400, description = "The id is not an integer; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such execution, or it is not a workflow run, or has no such step", body = crate::openapi::ErrorBody),
        (status = 422, description = "A query parameter is invalid; `parameter` names it", body = crate::openapi::ErrorBody),
    ))]
pub async fn get(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
    query: Result<Query<GraphQuery>, QueryRejection>,
) -> Result<Json<WorkflowRun>, ApiError> {
    let Path(id) = id?;
    let Query(query) = query?;
    let limit = match query.limit {
        None => DEFAULT_LIMIT,
        Some(limit) => usize::try_from(limit)
            .ok()
            .filter(|limit| (1..=MAX_LIMIT).contains(limit))
            .ok_or_else(|| ApiError::invalid("limit", format!("'limit' must be between 1 and {MAX_LIMIT}")))?,
    };
    let mut snapshot = db::snapshot(&state.db).await?;
    let run = db::execution::get(&mut *snapshot, id)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", format!("execution {id} does not exist")))?;
    let pinned = db::workflow::get(&mut *snapshot, id).await?.ok_or_else(|| {
        let message = match run.workflow_run {
            Some(parent) => {
                format!("execution {id} is a step of workflow run {parent}, not a run: GET /workflows/{parent}")
            }
            None => format!("execution {id} is not a workflow run"),
        };
        ApiError::not_found("workflow run", message)
    })?;
    let definition = db::workflow::definition(&mut *snapshot, &pinned.definition).await?;
    let spec: WorkflowSpec = definition.and_then(|value| serde_json::from_value(value).ok()).ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "definition_unreadable",
            format!("the definition {} of workflow run {id} cannot be read", pinned.definition),
        )
    })?;
    let made = db::workflow::step_executions(&mut *snapshot, id).await?;
    // a run that resumes none: its attempts are what it made (one read, not two)
    let attempts = match pinned.resumes {
        Some(_) => {
            let resumed = db::workflow::resumed(&mut *snapshot, id).await?;
            db::workflow::attempts(&mut snapshot, id, &resumed, &spec.main_steps()).await?
        }
        None => db::workflow::latest_attempts(&made),
    };
    snapshot.commit().await?;
    let mut executions: BTreeMap<String, Vec<StepExecution>> = BTreeMap::new();
    for execution in made {
        executions.entry(execution.step.clone()).or_default().push(execution);
    }
    let plan = workflow::plan(&spec, &run.parameters, &attempts);
    if let Some(name) = &query.step
        && !plan.steps.iter().any(|view| &view.name == name)
    {
        return Err(ApiError::not_found("step", format!("workflow run {id} has no step '{name}'")));
    }
    // (within the list pages' byte budget: a step's result may be large)
    let mut budget = state.settings.http.list_budget_bytes.saturating_sub(4096);
    let steps = plan
        .steps
        .into_iter()
        .filter(|view| query.step.as_ref().is_none_or(|name| name == &view.name))
        .map(|view| {
            let mut made = executions.remove(&view.name).unwrap_or_default();
            made.sort_by_key(|e| e.id);
            let attempts = made.len();
            let started = made.iter().map(|e| e.created).min();
            // a run that ended starts nothing more
            let state = match view.state {
                StepState::Waiting if run.status.is_terminal() => StepState::NotRun,
                other => other,
            };
            let over = matches!(state, StepState::Succeeded | StepState::Failed) && !made.is_empty();
            let finished = over.then(|| made.iter().filter_map(|e| e.finished).max()).flatten();
            let (executions, next_after) = page(made, query.after, limit, &mut budget);
            Step {
                name: view.name,
                action: view.action,
                phase: view.phase,
                state,
                needs: view.needs,
                items: view.items,
                reason: view.reason,
                attempts,
                started,
                finished,
                executions,
                next_after,
            }
        })
        .collect();
    Ok(Json(WorkflowRun {
        run,
        definition: pinned.definition,
        resumes: pinned.resumes,
        advanced: pinned.advanced,
        steps,
    }))
}

/// A step's executions (in id order) from `after` on: at most `limit` of them, within what is
/// left of `budget` (bytes; at least one is shown), and where the next page starts if any is left.
fn page(
    made: Vec<StepExecution>,
    after: Option<i64>,
    limit: usize,
    budget: &mut usize,
) -> (Vec<StepExecution>, Option<i64>) {
    let mut shown: Vec<StepExecution> = made.into_iter().filter(|e| after.is_none_or(|after| e.id > after)).collect();
    let mut more = shown.len() > limit;
    shown.truncate(limit);
    let sizes: Vec<usize> = shown.iter().map(|e| serde_json::to_vec(e).map_or(0, |bytes| bytes.len()) + 1).collect();
    let fit = crate::routes::executions::within_budget(sizes.iter().copied(), *budget);
    *budget = budget.saturating_sub(sizes[..fit].iter().sum());
    if fit < shown.len() {
        shown.truncate(fit);
        more = true;
    }
    let next_after = more.then(|| shown.last().map(|e| e.id)).flatten();
    (shown, next_after)
}
