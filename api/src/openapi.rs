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
    /// `unsupported_media_type`, `payload_too_large`, `method_not_allowed`, `not_found`,
    /// `execution_not_found`, `action_not_found`, `pack_not_found`, `already_retried`,
    /// `not_terminal`, `already_finished`, `not_stuck`, `idempotency_key_reused`, `invalid_pack`,
    /// `forbidden`, `token_not_found`, `own_token`, `unavailable`, `request_timeout`, `internal`.
    pub code: String,
    pub message: String,
    /// The request parameter that was wrong (`parameters.message`, `status`, `config.retry_of`,
    /// the `Idempotency-Key` header, ...).
    pub parameter: Option<String>,
    /// With `payload_too_large` for the whole body: its limit (`ATTUNE_API_MAX_BODY_BYTES`).
    pub limit_bytes: Option<i64>,
    /// With `already_retried`: the id of the existing retry.
    pub retry_execution: Option<i64>,
    /// With `idempotency_key_reused`: the execution the key's first request created.
    pub execution_id: Option<i64>,
    /// With `forbidden`: the least role the call needs.
    pub required_role: Option<attune_common::db::token::Role>,
    /// With `forbidden`: the role of the request's token.
    pub role: Option<attune_common::db::token::Role>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "attune", description = "Run actions, watch executions and their retries, operate workers."),
    components(schemas(ErrorBody, ErrorDetail)),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// Documents the answers every route can give besides its own: 401 on `/api/v1` (no, a malformed,
/// an unknown, a revoked or an expired token), 403 where the route needs more than the `read`
/// role (`roles::REQUIRED`), 400 where a path or query parameter can fail to parse (or an unknown
/// query parameter is sent) or a body is not JSON, 415 and 413 where a body is read, 422 where a
/// body can fail its schema. All in the one error shape, so that the document lists every status
/// the server can answer with (the framework's own rejections go through `ApiError`).
pub fn document_rejections(openapi: &mut utoipa::openapi::OpenApi) {
    use attune_common::db::token::Role;
    use utoipa::openapi::path::Operation;
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let error = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build())
            .build()
    };
    for (path, item) in openapi.paths.paths.iter_mut() {
        use axum::http::Method;
        let operations: [(Method, &mut Option<Operation>); 4] = [
            (Method::GET, &mut item.get),
            (Method::POST, &mut item.post),
            (Method::PUT, &mut item.put),
            (Method::DELETE, &mut item.delete),
        ];
        for (method, operation) in operations {
            let Some(operation) = operation else { continue };
            // (a webhook's delivery is proven by the webhook's own token or signature: no role,
            // and the event is its record)
            let delivery = path == crate::routes::events::DELIVERY_PATH && method == Method::POST;
            if path.starts_with("/api/v1") && !delivery {
                let needed = crate::roles::required(&method, path);
                if needed > Role::Read {
                    let forbidden = format!(
                        "`forbidden`: the token's role is below {needed}, the least role this call needs (`required_role`; the token's is `role`)"
                    );
                    match operation.responses.responses.get_mut("403") {
                        // the route's own 403 (a pack outside the packs directory) and this one
                        Some(RefOr::T(response)) => {
                            response.description = format!("{}; or {forbidden}", response.description)
                        }
                        _ => {
                            operation.responses.responses.insert("403".to_string(), error(&forbidden).into());
                        }
                    }
                }
            }
            let mut add = |status: &str, description: &str| {
                operation.responses.responses.entry(status.to_string()).or_insert_with(|| error(description).into());
            };
            if path.starts_with("/api/v1") {
                add(
                    "401",
                    "No bearer token, a malformed one, or one that is unknown, revoked or expired (`token expired`)",
                );
            }
            if path.starts_with("/api/v1") && method != Method::GET && !delivery {
                // every request that could change state is audited, with the reason it gives
                operation.parameters.get_or_insert_with(Vec::new).push(reason_parameter().into());
            }
            let has_parameters = operation.parameters.as_ref().is_some_and(|p| !p.is_empty());
            let has_body = operation.request_body.is_some();
            if has_parameters || has_body {
                add(
                    "400",
                    "A path or query parameter that does not parse, an unknown query parameter, or a body that is not JSON",
                );
            }
            if has_body {
                add(
                    "413",
                    "The body is larger than ATTUNE_API_MAX_BODY_BYTES (`payload_too_large`, `limit_bytes`), or than a route's own limit",
                );
                add("415", "The body is not sent as `application/json`");
                add("422", "The body does not match its schema; `parameter` names the field");
            }
            // any request the server does not answer in time (`server::with_limits`)
            add("503", "`request_timeout`: not answered within ATTUNE_API_REQUEST_TIMEOUT_SECS; try again");
        }
    }
}

/// `X-Attune-Reason` (`audit::reason`), as every route that could change state takes it.
fn reason_parameter() -> utoipa::openapi::path::Parameter {
    use utoipa::openapi::Required;
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(crate::audit::MAX_REASON_CHARS))
        .pattern(Some(r"^[^\x00-\x1F\x7F]*$"));
    ParameterBuilder::new()
        .name(crate::audit::REASON_HEADER)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(format!(
            "Why this is asked for, recorded in the audit trail (`GET /api/v1/audit`): printable UTF-8 text of at most {} characters",
            crate::audit::MAX_REASON_CHARS
        )))
        .schema(Some(schema))
        .build()
}

/// Text PostgreSQL can store: no NUL character (the server refuses one with a 422).
const STORABLE_TEXT: &str = r"^[^\x00]*$";

/// States in the document what the server checks in free-form JSON (`parameters`, `config`):
/// no NUL character in any key or string, at any depth (`StorableObject`, `StorableValue`).
pub fn document_storable_json(openapi: utoipa::openapi::OpenApi) -> serde_json::Value {
    use serde_json::json;
    let mut document = serde_json::to_value(&openapi).expect("the document serializes");
    let schemas = &mut document["components"]["schemas"];
    schemas["StorableObject"] = json!({
        "type": "object",
        "description": "A JSON object with no NUL character in any key or string, at any depth.",
        "propertyNames": {"pattern": STORABLE_TEXT},
        "additionalProperties": {"$ref": "#/components/schemas/StorableValue"},
    });
    schemas["StorableValue"] = json!({
        "anyOf": [
            {"type": "string", "pattern": STORABLE_TEXT},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "null"},
            {"type": "array", "items": {"$ref": "#/components/schemas/StorableValue"}},
            {"$ref": "#/components/schemas/StorableObject"},
        ],
    });
    for (schema, property) in
        [("CreateExecution", "parameters"), ("CreateExecution", "config"), ("RetryBody", "parameters")]
    {
        let field = &mut schemas[schema]["properties"][property];
        let description = field["description"].clone();
        *field = json!({
            "anyOf": [{"$ref": "#/components/schemas/StorableObject"}, {"type": "null"}],
            "description": description,
        });
    }
    // a secret's users: each an action, a pack or `*` (`routes::secrets::checked_users`)
    let users = &mut schemas["SetSecret"]["properties"]["users"];
    let description = users["description"].clone();
    *users = json!({
        "type": "array",
        "items": {"type": "string", "pattern": crate::routes::secrets::USER_PATTERN},
        "minItems": 1,
        "maxItems": crate::routes::secrets::MAX_SECRET_USERS,
        "description": description,
    });
    document
}

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
