//! The OpenAPI 3 document, generated from the handlers' annotations and the types they take and
//! return (utoipa). `routes::api_routes` registers every route through `utoipa_axum`, so a route
//! cannot be served without being documented; it is served at `/api/v1/openapi.json`.

use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// Every error response: `{"error": {...}}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code: `invalid_parameter`, `bad_request`, `unauthorized`,
    /// `execution_not_found`, `action_not_found`, `already_retried`, `not_terminal`,
    /// `already_finished`, `invalid_pack`, `unavailable`, `internal`.
    pub code: String,
    pub message: String,
    /// The request parameter that was wrong (`parameters.message`, `status`, `config.retry_of`, ...).
    pub parameter: Option<String>,
    /// With `already_retried`: the id of the existing retry.
    pub retry_execution: Option<i64>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "attune", description = "Run actions, watch executions and their retries, operate workers."),
    components(schemas(ErrorBody, ErrorDetail)),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}
