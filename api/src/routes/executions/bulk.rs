//! `POST /executions/bulk`: retry, cancel or fail the executions a filter selects, at most `limit`
//! (1,000) per call, oldest first, each by its own rules: a retry only of a failed execution
//! (`failed`, `timeout`, `abandoned`; `completed` or `canceled` only when the filter's status
//! names it) not yet retried (so the same call again retries none), a cancel or a fail only of an unfinished
//! one (a fail leaves a delayed retry alone). `dry_run` answers which it would act on and changes
//! nothing. A reason is required; the call is written to the audit trail with it; each retry
//! names the token as `submitted_by`, each cancel or fail as `ended_by`.
//!
//! A call's changes and its one audit row are one transaction: all of them are made, or (the
//! database away, the row refused) none. A retry another request beat is skipped by rolling back
//! to the savepoint taken before it.

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use attune_common::db::{self, execution::api::BulkAction, execution::api::BulkFilter};
use attune_core::{ExecutionStatus, FailureKind};

use super::{ManualRetry, end_by_hand, insert, plan_manual_retry, stop_if_running, timestamp};
use crate::ApiError;
use crate::server::Withdrawal;

const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BulkActionName {
    Retry,
    Cancel,
    Fail,
}

/// Which executions: every condition given must hold (at least one must be given, not null).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(min_properties = 1)]
#[serde(deny_unknown_fields)]
pub struct BulkFilterBody {
    /// One of the execution statuses.
    #[schema(value_type = Option<ExecutionStatus>)]
    pub status: Option<String>,
    #[schema(pattern = r"^[^\x00]*$")]
    pub action_ref: Option<String>,
    /// One of the failure kinds (`transient_error`, `timeout`, ...).
    #[schema(value_type = Option<FailureKind>)]
    pub failure_kind: Option<String>,
    /// RFC 3339 time.
    #[schema(value_type = Option<chrono::DateTime<chrono::Utc>>)]
    pub created_after: Option<String>,
    /// RFC 3339 time.
    #[schema(value_type = Option<chrono::DateTime<chrono::Utc>>)]
    pub created_before: Option<String>,
    /// The attempts of the retry chain whose first attempt this is.
    pub chain_root: Option<i64>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    pub action: BulkActionName,
    pub filter: BulkFilterBody,
    /// Answer which executions it would act on, and change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// At most this many executions (1 to 1000; 100 by default).
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Why: the audit trail records it with the call, and a fail in each execution's `error`.
    #[schema(min_length = 1, max_length = 1000, pattern = r"^[^\x00]*[^\s\x00][^\x00]*$")]
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BulkDone {
    /// The execution acted on.
    pub id: i64,
    /// What came of it: its retry for `retry`, the execution itself otherwise.
    pub execution_id: i64,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BulkSkipped {
    pub id: i64,
    /// Why (the error code a call on it alone would have answered): `already_retried`,
    /// `already_finished`, ...
    pub code: String,
    pub message: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BulkOutcome {
    pub action: BulkActionName,
    pub dry_run: bool,
    /// The executions selected, oldest first.
    pub selected: Vec<i64>,
    /// More executions match than `limit`: call again (after acting) for the rest.
    pub more: bool,
    /// Acted on (empty for a dry run).
    pub done: Vec<BulkDone>,
    /// Selected but left as they were: another change came first.
    pub skipped: Vec<BulkSkipped>,
}

#[utoipa::path(post, path = "/executions/bulk", operation_id = "bulk_executions", tag = "executions", request_body = BulkRequest,
    responses((status = 200, description = "What was selected and what came of each (a dry run changes nothing)", body = BulkOutcome),
        (status = 422, description = "A filter, the limit or the reason is invalid; `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn bulk(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    asking: crate::audit::Asking,
    withdrawal: Option<Extension<Withdrawal>>,
    crate::error::JsonObject(body): crate::error::JsonObject<BulkRequest>,
) -> Result<(Extension<crate::audit::Target>, Json<BulkOutcome>), ApiError> {
    let limit = body.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("'limit' must be between 1 and {MAX_LIMIT}")));
    }
    let filter = filter(body.filter)?;
    crate::audit::body_reason(&body.reason)?;
    let reason = body.reason;
    let action = match body.action {
        BulkActionName::Retry => BulkAction::Retry,
        BulkActionName::Cancel => BulkAction::Cancel,
        BulkActionName::Fail => BulkAction::Fail,
    };
    let mut selected = db::execution::api::select_for_bulk(&state.db, action, &filter, limit + 1).await?;
    let more = selected.len() as i64 > limit;
    selected.truncate(limit as usize);
    let target = crate::audit::Target {
        reason: Some(reason.clone()),
        // a dry run changes nothing, and its row says so
        ..crate::audit::Target::new(if body.dry_run {
            format!("dry run: executions:{}", selected.len())
        } else {
            format!("executions:{}", selected.len())
        })
    };
    let mut outcome = BulkOutcome {
        action: body.action,
        dry_run: body.dry_run,
        selected,
        more,
        done: Vec::new(),
        skipped: Vec::new(),
    };
    if body.dry_run || outcome.selected.is_empty() {
        return Ok((Extension(target), Json(outcome)));
    }
    // from here the request waits for its writes, however long they take (`server::Withdrawal`)
    let withdrawal = withdrawal.map(|Extension(withdrawal)| withdrawal).unwrap_or_default();
    if !withdrawal.begin_write() {
        return Err(ApiError::request_timeout(state.settings.http.request_timeout));
    }
    let by = caller.token_id;
    // retries are planned before the transaction begins: planning reads on connections of its
    // own, which a request holding one must not wait for
    let mut plans = std::collections::HashMap::new();
    if body.action == BulkActionName::Retry {
        for &id in &outcome.selected {
            let request = ManualRetry {
                parent: id,
                action_ref: None,
                parameters: None,
                merge: false,
                config: Default::default(),
                // (a step selected is skipped, naming its run: a run selected is retried as one)
                step_as_run: false,
            };
            plans.insert(id, plan_manual_retry(&state, request).await);
        }
    }
    let mut transaction = state.db.begin().await?;
    // a cancel or fail takes its rows' locks first, each it can have now: one a worker or an
    // executor holds is skipped (`busy`) rather than waited for, so that the call neither waits
    // behind them nor deadlocks with one that locks in another order, which would undo it all
    let busy: std::collections::HashSet<i64> = if body.action == BulkActionName::Retry {
        Default::default()
    } else {
        let held = db::execution::api::lock_free(&mut *transaction, &outcome.selected).await?;
        let held: std::collections::HashSet<i64> = held.into_iter().collect();
        outcome.selected.iter().copied().filter(|id| !held.contains(id)).collect()
    };
    // what to do once committed: the retries to count, the executions ended to stop on workers
    let (mut retries, mut ended) = (Vec::new(), Vec::new());
    for &id in &outcome.selected {
        if busy.contains(&id) {
            let message = format!("execution {id} is being changed by another (a worker, an executor): try again");
            outcome.skipped.push(BulkSkipped { id, code: "busy".into(), message });
            continue;
        }
        let done = match body.action {
            BulkActionName::Retry => {
                let planned = plans.remove(&id).expect("a plan for each selected execution");
                match planned {
                    Ok(new) => {
                        let mut savepoint = sqlx::Acquire::begin(&mut *transaction).await?;
                        match insert(&state, &mut *savepoint, &new, by).await {
                            Ok(retry) => {
                                savepoint.commit().await?;
                                let retry_id = retry.id;
                                retries.push(retry);
                                Ok(retry_id)
                            }
                            Err(e) => {
                                savepoint.rollback().await?;
                                Err(e)
                            }
                        }
                    }
                    Err(e) => Err(e),
                }
            }
            BulkActionName::Cancel => end_by_hand(
                &mut transaction,
                id,
                by,
                FailureKind::Canceled,
                format!("canceled by a client: {reason}"),
                "canceled",
                |_| Ok(()),
            )
            .await
            .map(|(execution, _)| {
                let execution_id = execution.id;
                ended.push(execution);
                execution_id
            }),
            BulkActionName::Fail => {
                let error = format!("failed by an operator: {reason}");
                end_by_hand(&mut transaction, id, by, FailureKind::OperatorFailed, error, "failed", super::stuck)
                    .await
                    .map(|(execution, _)| {
                        let execution_id = execution.id;
                        ended.push(execution);
                        execution_id
                    })
            }
        };
        match done {
            Ok(execution_id) => outcome.done.push(BulkDone { id, execution_id }),
            // (the database away is the whole call's failure: its transaction rolls back, and
            // nothing of it is made)
            Err(e) if e.status.is_server_error() => return Err(e),
            Err(e) => outcome.skipped.push(BulkSkipped { id, code: e.code.to_string(), message: e.message.clone() }),
        }
    }
    let target = asking.commit(transaction, axum::http::StatusCode::OK, target).await?;
    for retry in &retries {
        super::count_manual_retry(retry);
    }
    for execution in &ended {
        stop_if_running(&state, execution).await;
    }
    tracing::info!(action = ?body.action, done = outcome.done.len(), skipped = outcome.skipped.len(), token_id = by, "bulk action");
    Ok((target, Json(outcome)))
}

fn filter(body: BulkFilterBody) -> Result<BulkFilter, ApiError> {
    let given = body.status.is_some()
        || body.action_ref.is_some()
        || body.failure_kind.is_some()
        || body.created_after.is_some()
        || body.created_before.is_some()
        || body.chain_root.is_some();
    if !given {
        return Err(ApiError::invalid(
            "filter",
            "'filter' must name at least one condition (status, action_ref, failure_kind, created_after, created_before, chain_root)",
        ));
    }
    if let Some(action_ref) = &body.action_ref {
        crate::error::storable("filter.action_ref", action_ref)?;
    }
    let status = body
        .status
        .map(|s| {
            ExecutionStatus::parse(&s)
                .ok_or_else(|| ApiError::invalid("filter.status", format!("unknown status '{s}'")))
        })
        .transpose()?;
    let failure_kind = body
        .failure_kind
        .map(|k| {
            FailureKind::parse(&k)
                .ok_or_else(|| ApiError::invalid("filter.failure_kind", format!("unknown failure kind '{k}'")))
        })
        .transpose()?;
    Ok(BulkFilter {
        status,
        action_ref: body.action_ref,
        failure_kind,
        created_after: timestamp("filter.created_after", body.created_after)?,
        created_before: timestamp("filter.created_before", body.created_before)?,
        chain_root: body.chain_root,
    })
}
