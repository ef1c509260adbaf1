//! The routes, grouped by resource. Every route is registered through `utoipa_axum::routes!`, so
//! the OpenAPI document (`/api/v1/openapi.json`) lists exactly what is served.

pub mod audit;
pub mod catalog;
pub mod events;
pub mod executions;
pub mod pauses;
pub mod probes;
pub mod schedules;
pub mod secrets;
pub mod stats;
pub mod tokens;
pub mod workers;
pub mod workflows;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::State;

/// `/api/v1` (token required; the role each route needs is in `roles::REQUIRED`).
pub fn api_routes() -> OpenApiRouter<State> {
    OpenApiRouter::new()
        .routes(routes!(executions::create, executions::list))
        .routes(routes!(executions::get))
        .routes(routes!(executions::retry))
        .routes(routes!(executions::cancel))
        .routes(routes!(executions::fail))
        .routes(routes!(executions::chain::chain))
        .routes(routes!(executions::output::output))
        .routes(routes!(executions::bulk::bulk))
        .routes(routes!(workflows::get))
        .routes(routes!(catalog::list_actions))
        .routes(routes!(catalog::get_action))
        .routes(routes!(catalog::set_concurrency, catalog::clear_concurrency))
        .routes(routes!(catalog::list_packs, catalog::register_pack))
        .routes(routes!(workers::list))
        .routes(routes!(workers::drain, workers::undrain))
        .routes(routes!(workers::config))
        .routes(routes!(stats::retries))
        .routes(routes!(stats::retry_series))
        .routes(routes!(stats::workers))
        .routes(routes!(tokens::whoami))
        .routes(routes!(tokens::list, tokens::create))
        .routes(routes!(tokens::revoke))
        .routes(routes!(secrets::list))
        .routes(routes!(secrets::set, secrets::delete))
        .routes(routes!(audit::list))
        .routes(routes!(pauses::list))
        .routes(routes!(pauses::pause, pauses::resume))
        .routes(routes!(schedules::list, schedules::create))
        .routes(routes!(schedules::get, schedules::delete, schedules::replace))
        .routes(routes!(schedules::run_now))
        .routes(routes!(schedules::pause))
        .routes(routes!(schedules::resume))
        .routes(routes!(events::list_webhooks))
        .routes(routes!(events::set_credential))
        .routes(routes!(events::list_rules, events::create_rule))
        .routes(routes!(events::set_rule_enabled))
        .routes(routes!(events::delete_rule))
        .routes(routes!(events::list_events))
        .routes(routes!(events::get_event))
        .routes(routes!(events::replay))
}

/// Webhook deliveries: proven by the webhook's own token or signature, not an API token.
pub fn hook_routes() -> OpenApiRouter<State> {
    OpenApiRouter::new().routes(routes!(events::deliver))
}

/// Probes and metrics (no token).
pub fn probe_routes() -> OpenApiRouter<State> {
    OpenApiRouter::new()
        .routes(routes!(probes::healthz))
        .routes(routes!(probes::readyz))
        .routes(routes!(probes::metrics))
}
