//! `GET /executions/{id}/chain`: the attempts of a retry chain, with the timing between them,
//! within the list pages' byte budget (`ATTUNE_API_LIST_BUDGET_BYTES`). Every retry copies its
//! parent's `parameters` and `config`, so a long chain of large attempts would otherwise be held,
//! whole, once per request: an answer holds the attempts that fit, says it was `truncated`, and
//! where the rest start (`next_offset`). `fields=summary` leaves out the heavy fields.

use attune_common::db::{self, execution::Execution, execution::api::ChainLink};
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use super::{ListFields, MAX_OFFSET, PAGE_ENVELOPE_BYTES, ROW_OVERHEAD_BYTES, within_budget};
use crate::ApiError;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ChainQuery {
    /// `full` (the default): each attempt whole; `summary`: each attempt without `parameters`,
    /// `config`, `result`, `stdout` and `stderr` (it keeps `retry_decision`). Either way an
    /// answer holds about `ATTUNE_API_LIST_BUDGET_BYTES` of attempts at most (`truncated`,
    /// `next_offset`).
    #[param(value_type = Option<ListFields>)]
    pub fields: Option<ListFields>,
    /// Attempts to skip from the first attempt: the `next_offset` of the answer before.
    #[param(minimum = 0, maximum = 10000)]
    pub offset: Option<i64>,
}

/// One attempt of a retry chain, whole, with the timing between it and the attempt it retries.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Attempt {
    #[serde(flatten)]
    pub execution: Execution,
    /// Seconds from the previous attempt's end to this attempt's `not_before` (the computed backoff).
    pub backoff_secs: Option<f64>,
    /// Seconds from the previous attempt's end to this attempt's start.
    pub gap_secs: Option<f64>,
}

/// One attempt of a retry chain without its heavy fields (`fields=summary`): an
/// `ExecutionSummary`, with the RetryManager's decision and the timing of an `Attempt`. (Its
/// fields are written out rather than flattened: that documents `additionalProperties: false`,
/// which tells it from a whole `Attempt` in the answer's schema.)
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttemptSummary {
    pub id: i64,
    pub action: Option<i64>,
    pub action_ref: String,
    pub runtime: Option<String>,
    pub status: attune_core::ExecutionStatus,
    pub worker: Option<i64>,
    pub failure_kind: Option<attune_core::FailureKind>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub retry_count: i32,
    pub max_retries: Option<i32>,
    pub retry_reason: Option<String>,
    pub original_execution: Option<i64>,
    pub not_before: Option<DateTime<Utc>>,
    pub timeout_seconds: Option<i32>,
    pub started: Option<DateTime<Utc>>,
    pub finished: Option<DateTime<Utc>>,
    pub created: DateTime<Utc>,
    pub updated: DateTime<Utc>,
    /// What the RetryManager decided when it failed (see `Execution::retry_decision`).
    #[schema(value_type = Option<Object>)]
    pub retry_decision: Option<Value>,
    pub http_status: Option<i32>,
    pub idempotency_key: String,
    pub submitted_by: Option<i64>,
    pub ended_by: Option<i64>,
    /// The attempt after this one, if there is one.
    pub retried_by: Option<i64>,
    /// As in `Attempt`.
    pub backoff_secs: Option<f64>,
    /// As in `Attempt`.
    pub gap_secs: Option<f64>,
}

/// An attempt as the answer has it: whole (the default), or with `fields=summary` light.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
// (an answer's attempts live only until they are serialized: boxing the larger one would buy nothing)
#[allow(clippy::large_enum_variant)]
pub enum ChainAttempt {
    Summary(AttemptSummary),
    Full(Attempt),
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Chain<T> {
    /// The execution asked about.
    pub execution_id: i64,
    /// First attempt first, from `offset`.
    pub attempts: Vec<T>,
    /// The attempts of the whole chain.
    pub total: i64,
    /// Attempts skipped before the first one here.
    pub offset: i64,
    /// Where the rest of the chain starts (`offset` plus the attempts of this answer); null when
    /// this answer reaches the chain's last attempt.
    pub next_offset: Option<i64>,
    /// True when the byte budget (`ATTUNE_API_LIST_BUDGET_BYTES`) ended this answer before the
    /// chain's last attempt: more follow from `next_offset`.
    pub truncated: bool,
}

#[utoipa::path(get, path = "/executions/{id}/chain", operation_id = "get_execution_chain", tag = "executions",
    params(("id" = i64, Path, description = "Any execution of the chain"), ChainQuery),
    responses((status = 200, description = "First attempt first, whole unless `fields=summary`; an answer holds about `ATTUNE_API_LIST_BUDGET_BYTES` of attempts at most, and says where the rest start (`truncated`, `next_offset`)", body = Chain<ChainAttempt>),
        (status = 404, description = "No such execution", body = crate::openapi::ErrorBody),
        (status = 422, description = "`offset` out of range; `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn chain(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
    query: Result<Query<ChainQuery>, QueryRejection>,
) -> Result<Json<Chain<Box<RawValue>>>, ApiError> {
    let Path(id) = id?;
    let Query(query) = query?;
    let offset = query.offset.unwrap_or(0);
    if !(0..=MAX_OFFSET).contains(&offset) {
        return Err(ApiError::invalid("offset", format!("'offset' must be between 0 and {MAX_OFFSET}")));
    }
    // one snapshot for every read of the answer: a failure and the retry recorded with it (in one
    // transaction) are both in it or neither
    let mut snapshot = db::snapshot(&state.db).await?;
    // the chain's attempts weighed first, so that no more of them are read than the budget takes
    let links = db::execution::api::chain_links(&mut *snapshot, id).await?;
    if links.is_empty() {
        return Err(ApiError::not_found("execution", format!("execution {id} does not exist")));
    }
    let fields = query.fields.unwrap_or(ListFields::Full);
    let rest = links.get(offset as usize..).unwrap_or_default();
    let budget = state.settings.http.list_budget_bytes.saturating_sub(PAGE_ENVELOPE_BYTES);
    let weight = |link: &ChainLink| {
        let bytes = if fields == ListFields::Full { link.full_bytes } else { link.light_bytes };
        usize::try_from(bytes).unwrap_or(0).saturating_add(ROW_OVERHEAD_BYTES)
    };
    let fit = within_budget(rest.iter().map(weight), budget);
    let ids: Vec<i64> = rest[..fit].iter().map(|link| link.id).collect();
    let attempts = match fields {
        ListFields::Full => {
            let rows = db::execution::api::attempts(&mut *snapshot, &ids).await?;
            let ends = parent_ends(&mut snapshot, rows.iter().map(|row| row.original_execution)).await?;
            rows.into_iter()
                .map(|execution| {
                    let (backoff_secs, gap_secs) =
                        timing(&ends, execution.original_execution, execution.not_before, execution.started);
                    ChainAttempt::Full(Attempt { execution, backoff_secs, gap_secs })
                })
                .collect::<Vec<_>>()
        }
        ListFields::Summary => {
            let rows = db::execution::api::attempt_summaries(&mut *snapshot, &ids).await?;
            let ends = parent_ends(&mut snapshot, rows.iter().map(|row| row.summary.original_execution)).await?;
            rows.into_iter().map(|row| ChainAttempt::Summary(light(row, &ends))).collect()
        }
    };
    // (the connection back to the pool before the answer is made)
    drop(snapshot);
    // and as sent: the estimate cannot know how much JSON escaping adds
    let mut items = attempts
        .iter()
        .map(serde_json::value::to_raw_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::internal("an attempt did not serialize", e))?;
    items.truncate(within_budget(items.iter().map(|item| item.get().len() + 1), budget));
    let truncated = items.len() < rest.len();
    let next_offset = truncated.then_some(offset + items.len() as i64);
    let total = links.len() as i64;
    Ok(Json(Chain { execution_id: id, attempts: items, total, offset, next_offset, truncated }))
}

/// When the attempts that `parents` name ended (each attempt's parent is the one before it; the
/// first of an answer's may be in the answer before).
async fn parent_ends(
    snapshot: &mut sqlx::PgConnection,
    parents: impl Iterator<Item = Option<i64>>,
) -> Result<Vec<(i64, Option<DateTime<Utc>>)>, ApiError> {
    let parents: Vec<i64> = parents.flatten().collect();
    if parents.is_empty() {
        return Ok(Vec::new());
    }
    Ok(db::execution::api::finished_times(snapshot, &parents).await?)
}

/// An attempt's `backoff_secs` and `gap_secs`: from its parent's end to its `not_before`, and to
/// its start.
fn timing(
    ends: &[(i64, Option<DateTime<Utc>>)],
    parent: Option<i64>,
    not_before: Option<DateTime<Utc>>,
    started: Option<DateTime<Utc>>,
) -> (Option<f64>, Option<f64>) {
    let parent_end = ends.iter().find(|(id, _)| Some(*id) == parent).and_then(|(_, end)| *end);
    let seconds = |to: Option<DateTime<Utc>>| match (parent_end, to) {
        (Some(from), Some(to)) => Some((to - from).num_milliseconds() as f64 / 1000.0),
        _ => None,
    };
    (seconds(not_before), seconds(started))
}

fn light(row: db::execution::api::AttemptSummary, ends: &[(i64, Option<DateTime<Utc>>)]) -> AttemptSummary {
    // every field named, so that a field added to the summary is not left out here unnoticed
    let db::execution::api::ExecutionSummary {
        id,
        action,
        action_ref,
        runtime,
        status,
        worker,
        failure_kind,
        error,
        exit_code,
        retry_count,
        max_retries,
        retry_reason,
        original_execution,
        not_before,
        timeout_seconds,
        started,
        finished,
        created,
        updated,
        http_status,
        idempotency_key,
        submitted_by,
        ended_by,
        retried_by,
    } = row.summary;
    let (backoff_secs, gap_secs) = timing(ends, original_execution, not_before, started);
    AttemptSummary {
        id,
        action,
        action_ref,
        runtime,
        status,
        worker,
        failure_kind,
        error,
        exit_code,
        retry_count,
        max_retries,
        retry_reason,
        original_execution,
        not_before,
        timeout_seconds,
        started,
        finished,
        created,
        updated,
        retry_decision: row.retry_decision,
        http_status,
        idempotency_key,
        submitted_by,
        ended_by,
        retried_by,
        backoff_secs,
        gap_secs,
    }
}
