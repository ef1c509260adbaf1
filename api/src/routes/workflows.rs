//! `GET /workflows/{id}`: a workflow run as a graph. Each step with its state (as the executors'
//! planner sees it, from the same record: `attune_core::workflow::plan`), what it needs, its
//! items, and every execution it made (each attempt of each item, with its status, timing, error
//! and result). One snapshot: a step's result and what the run made of it are read together.

use std::collections::BTreeMap;

use attune_common::db::{self, execution::Execution, workflow::StepExecution};
use attune_core::workflow::{self, ItemState, Phase, StepState, WorkflowSpec};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::ApiError;

/// A workflow run and its steps.
#[derive(Debug, Serialize, utoipa::ToSchema)]
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

#[derive(Debug, Serialize, utoipa::ToSchema)]
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
    pub executions: Vec<StepExecution>,
}

#[utoipa::path(get, path = "/workflows/{id}", operation_id = "get_workflow_run", tag = "workflows",
    params(("id" = i64, Path, description = "The workflow run's execution id")),
    responses(
        (status = 200, description = "The run and each of its steps", body = WorkflowRun),
        (status = 400, description = "The id is not an integer; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such execution, or it is not a workflow run", body = crate::openapi::ErrorBody),
    ))]
pub async fn get(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<WorkflowRun>, ApiError> {
    let Path(id) = id?;
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
    let steps = plan
        .steps
        .into_iter()
        .map(|view| {
            let executions = executions.remove(&view.name).unwrap_or_default();
            let started = executions.iter().map(|e| e.created).min();
            // a run that ended starts nothing more
            let state = match view.state {
                StepState::Waiting if run.status.is_terminal() => StepState::NotRun,
                other => other,
            };
            let over = matches!(state, StepState::Succeeded | StepState::Failed) && !executions.is_empty();
            let finished = over.then(|| executions.iter().filter_map(|e| e.finished).max()).flatten();
            Step {
                name: view.name,
                action: view.action,
                phase: view.phase,
                state,
                needs: view.needs,
                items: view.items,
                reason: view.reason,
                attempts: executions.len(),
                started,
                finished,
                executions,
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
