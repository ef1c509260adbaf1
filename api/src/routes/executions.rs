//! Executions: submit, read, list.

use attune_common::db::{self, execution::Execution, execution::ListFilter, execution::NewExecution};
use attune_common::mq::{ExecutionRequest, REQUEST_KEY};
use attune_common::{ExecutionStatus, params};
use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ApiError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateExecution {
    pub action_ref: String,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default)]
    pub config: Option<Value>,
}

fn object(parameter: &str, value: Option<Value>) -> Result<Map<String, Value>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(ApiError::invalid(parameter, format!("'{parameter}' must be a JSON object"))),
    }
}

pub async fn create(
    State(state): State<crate::State>,
    body: Result<Json<CreateExecution>, JsonRejection>,
) -> Result<(StatusCode, Json<Execution>), ApiError> {
    let Json(body) = body?;
    let given = object("parameters", body.parameters)?;
    let config = object("config", body.config)?;
    let action = db::action::get_by_ref(&state.db, &body.action_ref)
        .await?
        .ok_or_else(|| ApiError::not_found("action", format!("action '{}' does not exist", body.action_ref)))?;
    let specs: params::ParamSpecs = serde_json::from_value(action.parameters.clone())
        .map_err(|e| ApiError::internal("stored parameter declarations are unreadable", e))?;
    let resolved = params::validate(&specs, &given)
        .map_err(|e| ApiError::invalid(&format!("parameters.{}", e.parameter), e.to_string()))?;
    let new = NewExecution {
        action: Some(action.id),
        action_ref: action.action_ref.clone(),
        parameters: Value::Object(resolved),
        config: Value::Object(config),
        status: ExecutionStatus::Requested,
        max_retries: action.max_retries.unwrap_or(0),
        timeout_seconds: action.timeout_seconds.unwrap_or(state.settings.common.default_timeout_secs),
        retry_count: 0,
        retry_reason: None,
        original_execution: None,
        not_before: None,
    };
    let execution = db::execution::insert(&state.db, &new).await?;
    // The row is the record; if this publish fails the executors' monitor re-publishes it.
    if let Err(e) = state.publisher.publish(REQUEST_KEY, &ExecutionRequest { execution_id: execution.id }).await {
        tracing::warn!(execution_id = execution.id, error = %e, "could not publish the request now; the monitor will");
    }
    Ok((StatusCode::CREATED, Json(execution)))
}

pub async fn get(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<Execution>, ApiError> {
    let Path(id) = id?;
    db::execution::get(&state.db, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("execution", format!("execution {id} does not exist")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub status: Option<String>,
    pub action_ref: Option<String>,
    pub created_after: Option<String>,
    pub created_before: Option<String>,
    pub limit: Option<i64>,
    pub offset: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

fn timestamp(parameter: &str, value: Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    value
        .map(|text| {
            DateTime::parse_from_rfc3339(&text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| ApiError::invalid(parameter, format!("'{parameter}' must be an RFC 3339 time: {e}")))
        })
        .transpose()
}

pub async fn list(
    State(state): State<crate::State>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Page<Execution>>, ApiError> {
    let Query(query) = query?;
    let status = query
        .status
        .map(|s| {
            ExecutionStatus::parse(&s).ok_or_else(|| {
                let known: Vec<&str> = ExecutionStatus::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::invalid("status", format!("unknown status '{s}' (expected one of: {})", known.join(", ")))
            })
        })
        .transpose()?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "'limit' must be between 1 and 1000"));
    }
    let offset = query.offset.unwrap_or(0);
    if offset < 0 {
        return Err(ApiError::invalid("offset", "'offset' must not be negative"));
    }
    let filter = ListFilter {
        status,
        action_ref: query.action_ref,
        created_after: timestamp("created_after", query.created_after)?,
        created_before: timestamp("created_before", query.created_before)?,
        limit,
        offset,
    };
    let (items, total) = db::execution::list(&state.db, &filter).await?;
    Ok(Json(Page { items, total, limit, offset }))
}
