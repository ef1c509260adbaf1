//! `GET /api/v1/audit`: the audit trail, newest first (admin).

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use attune_common::db::{self, audit::Event};

use crate::ApiError;

const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Events of this API token (its id)
    pub token_id: Option<i64>,
    /// Events of this token name, or of this actor past the API (`cli:<user>`)
    #[param(min_length = 1, max_length = 255)]
    pub actor: Option<String>,
    /// The request's method (`POST`, `PUT`, `DELETE`)
    #[param(min_length = 1, max_length = 16)]
    pub method: Option<String>,
    /// The route as the OpenAPI document writes it (`/api/v1/executions/{id}/cancel`)
    #[param(min_length = 1, max_length = 255)]
    pub route: Option<String>,
    /// What the request made (`execution:43`, `token:7`)
    #[param(min_length = 1, max_length = 255)]
    pub target: Option<String>,
    /// Events at or after this time (RFC 3339)
    pub since: Option<DateTime<Utc>>,
    /// Events before this time (RFC 3339)
    pub until: Option<DateTime<Utc>>,
    /// Events with ids below this one (the `next_before` of the page before)
    pub before: Option<i64>,
    /// At most this many events (1 to 1000; 100 by default), and no more than
    /// `ATTUNE_API_LIST_BUDGET_BYTES` of them (then `next_before` says where the rest start)
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// Newest first.
    pub events: Vec<Event>,
    /// Where the next (older) page starts (`before`); null on the last page.
    pub next_before: Option<i64>,
}

#[utoipa::path(get, path = "/audit", operation_id = "list_audit_events", tag = "audit", params(AuditQuery),
    responses((status = 200, description = "The audit trail, newest first: every request that could change state, whatever it was answered, and the changes made by the command line past the API", body = AuditPage),
        (status = 422, description = "A filter is invalid; `parameter` names it", body = crate::openapi::ErrorBody),))]
pub async fn list(
    State(state): State<crate::State>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Json<AuditPage>, ApiError> {
    let Query(query) = query?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("'limit' must be between 1 and {MAX_LIMIT}")));
    }
    for (name, value, most) in [
        ("actor", &query.actor, 255),
        ("method", &query.method, 16),
        ("route", &query.route, 255),
        ("target", &query.target, 255),
    ] {
        if let Some(value) = value {
            if value.is_empty() || value.chars().count() > most {
                return Err(ApiError::invalid(name, format!("'{name}' must be 1 to {most} characters")));
            }
            crate::error::storable(name, value)?;
        }
    }
    let filter = db::audit::Filter {
        token_id: query.token_id,
        actor: query.actor,
        method: query.method.map(|m| m.to_ascii_uppercase()),
        route: query.route,
        target: query.target,
        since: query.since,
        until: query.until,
        before: query.before,
        limit,
    };
    let mut events = db::audit::list(&state.db, &filter).await?;
    let mut full = events.len() as i64 == limit;
    // within the list pages' byte budget (a path and a reason may be long): the rest on the next
    let budget = state.settings.http.list_budget_bytes.saturating_sub(1024);
    let sizes = events.iter().map(|e| serde_json::to_vec(e).map_or(0, |bytes| bytes.len()) + 1);
    let fit = crate::routes::executions::within_budget(sizes, budget);
    if fit < events.len() {
        events.truncate(fit);
        full = true;
    }
    let next_before = full.then(|| events.last().map(|e| e.id)).flatten();
    Ok(Json(AuditPage { events, next_before }))
}
