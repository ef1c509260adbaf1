//! The audit trail (`audit_event`, append-only): who asked for what, when, and what they were
//! answered. The API writes a row for every request that could change state (`attune_api::audit`),
//! a change's in the change's own transaction;
//! the command line writes one for each change it makes in the database directly (tokens).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgExecutor, PgPool, QueryBuilder};

/// One event to write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub token_id: Option<i64>,
    pub role: Option<String>,
    pub actor: Option<String>,
    pub method: String,
    pub route: String,
    pub path: String,
    pub status: i16,
    pub target: Option<String>,
    pub reason: Option<String>,
}

/// What the audit row of a submission written with its execution records besides the token
/// (`db::execution::Submitter`).
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    /// The token's role.
    pub role: String,
    /// The `X-Attune-Reason` given.
    pub reason: Option<String>,
}

/// An event as read, with the name of the token that asked.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Event {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// The API token that asked (`api_token.id`); null for a change made past the API.
    pub token_id: Option<i64>,
    /// That token's name.
    pub token_name: Option<String>,
    /// Its role when it asked.
    pub role: Option<String>,
    /// Who asked when no token did (`cli:<user>`).
    pub actor: Option<String>,
    pub method: String,
    /// The route as the OpenAPI document writes it (`/api/v1/executions/{id}/cancel`), or what
    /// the command line did (`token create`).
    pub route: String,
    /// The request's path (`/api/v1/executions/42/cancel`).
    pub path: String,
    /// The HTTP status it was answered (0: a change made past the API).
    pub status: i16,
    /// What it made or changed when the path does not say (`execution:43`, `token:7`).
    pub target: Option<String>,
    /// The reason given (`X-Attune-Reason`, the CLI's `--reason`).
    pub reason: Option<String>,
}

/// Writes `events` in one statement.
pub async fn insert_many(db: impl PgExecutor<'_>, events: &[NewEvent]) -> Result<u64, sqlx::Error> {
    if events.is_empty() {
        return Ok(0);
    }
    let column = |f: &dyn Fn(&NewEvent) -> Option<String>| events.iter().map(f).collect::<Vec<_>>();
    sqlx::query(
        "INSERT INTO audit_event (token_id, role, actor, method, route, path, status, target, reason) \
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
            $7::smallint[], $8::text[], $9::text[])",
    )
    .bind(events.iter().map(|e| e.token_id).collect::<Vec<_>>())
    .bind(column(&|e| e.role.clone()))
    .bind(column(&|e| e.actor.clone()))
    .bind(column(&|e| Some(e.method.clone())))
    .bind(column(&|e| Some(e.route.clone())))
    .bind(column(&|e| Some(e.path.clone())))
    .bind(events.iter().map(|e| e.status).collect::<Vec<_>>())
    .bind(column(&|e| e.target.clone()))
    .bind(column(&|e| e.reason.clone()))
    .execute(db)
    .await
    .map(|done| done.rows_affected())
}

/// What to read: every filter optional; newest first, `limit` rows with ids below `before`.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub token_id: Option<i64>,
    pub actor: Option<String>,
    pub method: Option<String>,
    pub route: Option<String>,
    /// Events whose target is this (`execution:42`: what a request made; a request on an
    /// execution's own path, a cancel say, is found by `route` and its path).
    pub target: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub before: Option<i64>,
    pub limit: i64,
}

/// The events `filter` selects, newest first.
pub async fn list(db: &PgPool, filter: &Filter) -> Result<Vec<Event>, sqlx::Error> {
    let mut query = QueryBuilder::new(
        "SELECT a.id, a.at, a.token_id, t.name AS token_name, a.role, a.actor, a.method, a.route, a.path, \
            a.status, a.target, a.reason FROM audit_event a LEFT JOIN api_token t ON t.id = a.token_id WHERE true",
    );
    if let Some(token) = filter.token_id {
        query.push(" AND a.token_id = ").push_bind(token);
    }
    if let Some(actor) = &filter.actor {
        query
            .push(" AND (a.actor = ")
            .push_bind(actor.clone())
            .push(" OR t.name = ")
            .push_bind(actor.clone())
            .push(")");
    }
    if let Some(method) = &filter.method {
        query.push(" AND a.method = ").push_bind(method.clone());
    }
    if let Some(route) = &filter.route {
        query.push(" AND a.route = ").push_bind(route.clone());
    }
    if let Some(target) = &filter.target {
        query.push(" AND a.target = ").push_bind(target.clone());
    }
    if let Some(since) = filter.since {
        query.push(" AND a.at >= ").push_bind(since);
    }
    if let Some(until) = filter.until {
        query.push(" AND a.at < ").push_bind(until);
    }
    if let Some(before) = filter.before {
        query.push(" AND a.id < ").push_bind(before);
    }
    query.push(" ORDER BY a.id DESC LIMIT ").push_bind(filter.limit);
    query.build_query_as().fetch_all(db).await
}

/// Removes (or moves into `audit_event_archive`) up to `batch` events older than `age_secs`,
/// oldest first, through `audit_prune`, which never removes one younger than the database's
/// `audit_retention.min_age` (the executors' login deletes no audit row itself). Returns how many.
pub async fn prune(db: &PgPool, age_secs: f64, batch: i64, archive: bool) -> Result<u64, sqlx::Error> {
    let removed: i64 = sqlx::query_scalar("SELECT audit_prune($1, $2, $3)")
        .bind(age_secs)
        .bind(batch)
        .bind(archive)
        .fetch_one(db)
        .await?;
    Ok(removed as u64)
}

/// The youngest an audit event may be for `prune` to remove it (`audit_retention.min_age`).
pub async fn retention_floor_secs(db: &PgPool) -> Result<f64, sqlx::Error> {
    sqlx::query_scalar("SELECT extract(epoch FROM min_age)::float8 FROM audit_retention").fetch_one(db).await
}
