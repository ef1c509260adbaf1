//! Who may call what: the one table (`REQUIRED`) from each `/api/v1` route (method and path
//! template, as the OpenAPI document and axum's `MatchedPath` write it) to the role it needs, and
//! the middleware (`enforce`) that checks it. `enforce` runs after the token is verified
//! (`auth::require_token` puts the `Caller` with its role on the request) and before any handler
//! or extractor, so a refused call is a 403 whatever its body or parameters.
//!
//! The policy: `read` may call every GET but the token and secret lists and the audit trail; `operator` also
//! submits, retries, cancels and fails executions, pauses and resumes actions and runtimes, sets
//! actions' concurrency policies, makes, pauses and deletes schedules, makes, enables, disables
//! and deletes rules, drains and undrains workers, replays events, and lists the secrets' names; `admin` also
//! registers packs and manages tokens and secrets. A route missing
//! from the table needs `admin` (and the tests fail on it: every route of the OpenAPI document
//! must be listed here, so none is added without deciding who may call it). A method the path
//! does not serve is let through to its 405.

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

pub use attune_common::db::token::Role;

use crate::ApiError;
use crate::auth::Caller;

/// Every `/api/v1` route and the least role that may call it.
pub const REQUIRED: &[(Method, &str, Role)] = &[
    (Method::GET, "/api/v1/executions", Role::Read),
    (Method::POST, "/api/v1/executions", Role::Operator),
    (Method::GET, "/api/v1/executions/{id}", Role::Read),
    (Method::POST, "/api/v1/executions/{id}/retry", Role::Operator),
    (Method::POST, "/api/v1/executions/{id}/cancel", Role::Operator),
    (Method::POST, "/api/v1/executions/{id}/fail", Role::Operator),
    (Method::GET, "/api/v1/executions/{id}/chain", Role::Read),
    (Method::GET, "/api/v1/executions/{id}/output", Role::Read),
    (Method::POST, "/api/v1/executions/bulk", Role::Operator),
    (Method::GET, "/api/v1/workflows/{id}", Role::Read),
    (Method::GET, "/api/v1/actions", Role::Read),
    (Method::GET, "/api/v1/actions/{action_ref}", Role::Read),
    (Method::PUT, "/api/v1/actions/{action_ref}/concurrency", Role::Operator),
    (Method::DELETE, "/api/v1/actions/{action_ref}/concurrency", Role::Operator),
    (Method::GET, "/api/v1/packs", Role::Read),
    (Method::POST, "/api/v1/packs", Role::Admin),
    (Method::GET, "/api/v1/workers", Role::Read),
    (Method::PUT, "/api/v1/workers/{name}/drain", Role::Operator),
    (Method::DELETE, "/api/v1/workers/{name}/drain", Role::Operator),
    (Method::GET, "/api/v1/config", Role::Read),
    (Method::GET, "/api/v1/stats/retries", Role::Read),
    (Method::GET, "/api/v1/stats/retries/series", Role::Read),
    (Method::GET, "/api/v1/stats/workers", Role::Read),
    (Method::GET, "/api/v1/whoami", Role::Read),
    (Method::GET, "/api/v1/tokens", Role::Admin),
    (Method::POST, "/api/v1/tokens", Role::Admin),
    (Method::DELETE, "/api/v1/tokens/{id}", Role::Admin),
    (Method::GET, "/api/v1/secrets", Role::Operator),
    (Method::PUT, "/api/v1/secrets/{name}", Role::Admin),
    (Method::DELETE, "/api/v1/secrets/{name}", Role::Admin),
    (Method::GET, "/api/v1/audit", Role::Admin),
    (Method::GET, "/api/v1/pauses", Role::Read),
    (Method::PUT, "/api/v1/pauses/{kind}/{name}", Role::Operator),
    (Method::DELETE, "/api/v1/pauses/{kind}/{name}", Role::Operator),
    (Method::GET, "/api/v1/schedules", Role::Read),
    (Method::POST, "/api/v1/schedules", Role::Operator),
    (Method::GET, "/api/v1/schedules/{name}", Role::Read),
    (Method::DELETE, "/api/v1/schedules/{name}", Role::Operator),
    (Method::PUT, "/api/v1/schedules/{name}", Role::Operator),
    (Method::POST, "/api/v1/schedules/{name}/run", Role::Operator),
    (Method::POST, "/api/v1/schedules/{name}/pause", Role::Operator),
    (Method::POST, "/api/v1/schedules/{name}/resume", Role::Operator),
    (Method::GET, "/api/v1/webhooks", Role::Read),
    (Method::PUT, "/api/v1/webhooks/{name}/credential", Role::Admin),
    (Method::GET, "/api/v1/rules", Role::Read),
    (Method::POST, "/api/v1/rules", Role::Operator),
    (Method::PUT, "/api/v1/rules/{ref}/enabled", Role::Operator),
    (Method::DELETE, "/api/v1/rules/{ref}", Role::Operator),
    (Method::GET, "/api/v1/events", Role::Read),
    (Method::GET, "/api/v1/events/{id}", Role::Read),
    (Method::POST, "/api/v1/events/{id}/replay", Role::Operator),
];

/// The role `method` on the route `path` (a template: `/api/v1/executions/{id}`) needs: its entry
/// in `REQUIRED`; for a method the path does not serve (answered 405), `read`; for a path not in
/// the table, `admin`. A HEAD is its GET.
pub fn required(method: &Method, path: &str) -> Role {
    let method = if method == Method::HEAD { &Method::GET } else { method };
    let mut listed = false;
    for (m, p, role) in REQUIRED {
        if *p == path {
            if m == method {
                return *role;
            }
            listed = true;
        }
    }
    if listed { Role::Read } else { Role::Admin }
}

/// Refuses (403 `forbidden`) a call beyond the caller's role.
pub async fn enforce(request: Request, next: Next) -> Result<Response, ApiError> {
    let caller = *request
        .extensions()
        .get::<Caller>()
        .ok_or_else(|| ApiError::internal("no verified token on the request", "roles::enforce runs inside auth"))?;
    // a request no route matched has no path template and reaches only the "no such route" fallback
    if let Some(path) = request.extensions().get::<MatchedPath>() {
        let needed = required(request.method(), path.as_str());
        if caller.role < needed {
            tracing::info!(token_id = caller.token_id, role = %caller.role, %needed, method = %request.method(),
                path = path.as_str(), "call refused by role");
            return Err(ApiError::forbidden(needed, caller.role));
        }
    }
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The routes the OpenAPI document lists under `/api/v1`, as (method, path).
    fn documented() -> BTreeSet<(String, String)> {
        let (_, document) = utoipa_axum::router::OpenApiRouter::<crate::State>::new()
            .nest("/api/v1", crate::routes::api_routes())
            .split_for_parts();
        let document = serde_json::to_value(&document).unwrap();
        let mut routes = BTreeSet::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                routes.insert((method.to_uppercase(), path.clone()));
            }
        }
        routes
    }

    #[test]
    fn every_documented_route_has_exactly_one_entry_and_every_entry_is_a_route() {
        let documented = documented();
        assert!(documented.len() >= 20, "{documented:?}");
        let mut listed = BTreeSet::new();
        for (method, path, _) in REQUIRED {
            assert!(listed.insert((method.to_string(), path.to_string())), "{method} {path} is listed twice");
        }
        let unlisted: Vec<_> = documented.difference(&listed).collect();
        assert!(unlisted.is_empty(), "decide who may call these routes in roles::REQUIRED: {unlisted:?}");
        let stale: Vec<_> = listed.difference(&documented).collect();
        assert!(stale.is_empty(), "roles::REQUIRED lists routes that are not served: {stale:?}");
    }

    #[test]
    fn reads_are_for_everyone_and_the_rest_as_the_policy_says() {
        for (method, path, role) in REQUIRED {
            let expected = if path.starts_with("/api/v1/tokens") || path.starts_with("/api/v1/audit") {
                Role::Admin
            } else if path.starts_with("/api/v1/secrets") {
                // the names, for operators to refer to; the values are set by admins alone
                if method == Method::GET { Role::Operator } else { Role::Admin }
            } else if method == Method::GET {
                Role::Read
            } else if path.starts_with("/api/v1/executions")
                || path.starts_with("/api/v1/events")
                || path.starts_with("/api/v1/rules")
                || path.starts_with("/api/v1/workers")
                || path.starts_with("/api/v1/pauses")
                || path.starts_with("/api/v1/schedules")
                || path.ends_with("/concurrency")
            {
                Role::Operator
            } else {
                Role::Admin
            };
            assert_eq!(*role, expected, "{method} {path}");
        }
    }

    #[test]
    fn a_head_is_its_get_another_method_reaches_its_405_and_an_unlisted_path_needs_admin() {
        assert_eq!(required(&Method::GET, "/api/v1/executions/{id}"), Role::Read);
        assert_eq!(required(&Method::HEAD, "/api/v1/tokens"), Role::Admin);
        assert_eq!(required(&Method::POST, "/api/v1/executions/{id}/cancel"), Role::Operator);
        assert_eq!(required(&Method::DELETE, "/api/v1/executions/{id}"), Role::Read);
        assert_eq!(required(&Method::GET, "/api/v1/new-route"), Role::Admin);
    }
}
