//! The routes, grouped by resource.

mod catalog;
mod executions;
mod probes;
mod stats;
mod workers;

use axum::Router;
use axum::routing::{get, post};

use crate::State;

pub fn api_routes() -> Router<State> {
    Router::new()
        .route("/executions", post(executions::create).get(executions::list))
        .route("/executions/{id}", get(executions::get))
        .route("/executions/{id}/retry", post(executions::retry))
        .route("/executions/{id}/cancel", post(executions::cancel))
        .route("/executions/{id}/chain", get(executions::chain))
        .route("/actions", get(catalog::list_actions))
        .route("/actions/{action_ref}", get(catalog::get_action))
        .route("/packs", get(catalog::list_packs).post(catalog::register_pack))
        .route("/workers", get(workers::list))
        .route("/stats/retries", get(stats::retries))
        .route("/stats/workers", get(stats::workers))
}

pub fn probe_routes() -> Router<State> {
    Router::new()
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
}
