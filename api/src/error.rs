//! The API's one error shape: `{"error": {"code": "...", "message": "...", "parameter": "..."}}`.
//! Clients get a clear message; internal details go to the log only.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub parameter: Option<String>,
    pub extra: Option<serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), parameter: None, extra: None }
    }
    /// A request parameter (body field, query or path) that is wrong: 422 unless said otherwise.
    pub fn invalid(parameter: &str, message: impl Into<String>) -> Self {
        ApiError {
            parameter: Some(parameter.to_string()),
            ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_parameter", message)
        }
    }
    pub fn bad_request(parameter: Option<&str>, message: impl Into<String>) -> Self {
        ApiError {
            parameter: parameter.map(str::to_string),
            ..Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
        }
    }
    pub fn not_found(what: &'static str, message: impl Into<String>) -> Self {
        let code = match what {
            "execution" => "execution_not_found",
            "action" => "action_not_found",
            "pack" => "pack_not_found",
            "token" => "token_not_found",
            _ => "not_found",
        };
        Self::new(StatusCode::NOT_FOUND, code, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    /// A call beyond the caller's role: 403 `forbidden`, naming the role it needs
    /// (`required_role`) and the caller's (`role`).
    pub fn forbidden(required: attune_common::db::token::Role, role: attune_common::db::token::Role) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this call needs the role {required} (or above); the token's role is {role}"),
        )
        .with_extra(json!({"required_role": required, "role": role}))
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
    pub fn internal(context: &str, error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "{context}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("{context}; see the server log"))
    }
    /// A request body larger than `ATTUNE_API_MAX_BODY_BYTES` (`limit`): 413 naming the limit,
    /// with the body's declared length when it had one.
    pub fn body_too_large(limit: usize, declared: Option<u64>) -> Self {
        let size = match declared {
            Some(length) => format!("the request body is {length} bytes"),
            None => "the request body is larger".to_string(),
        };
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("{size}, more than the limit of {limit} bytes (ATTUNE_API_MAX_BODY_BYTES)"),
        )
        .with_extra(json!({"limit_bytes": limit}))
    }
    /// A request not answered within `ATTUNE_API_REQUEST_TIMEOUT_SECS` (`limit`): 503, which a
    /// client may retry (a submission safely with an `Idempotency-Key`).
    pub fn request_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "request_timeout",
            format!(
                "the request was not answered within {} s (ATTUNE_API_REQUEST_TIMEOUT_SECS); try again",
                limit.as_secs()
            ),
        )
    }
    pub fn with_extra(mut self, extra: serde_json::Value) -> Self {
        self.extra = Some(extra);
        self
    }
}

impl From<sqlx::Error> for ApiError {
    /// By the one transience rule every service uses (`db::is_transient`): the database away
    /// (or a lost race) is a 503 the client may retry; anything else is a 500.
    fn from(error: sqlx::Error) -> Self {
        if attune_common::db::is_transient(&error) {
            tracing::error!(%error, "database unavailable");
            ApiError::unavailable("the database is unavailable; try again")
        } else {
            ApiError::internal("database query failed", error)
        }
    }
}

/// The `code` of an error response, as a response extension: the server's own layers read it
/// (`server::with_limits` names the body limit on an extractor's 413).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = ErrorCode(self.code);
        let mut body = json!({"code": self.code, "message": self.message});
        if let Some(parameter) = self.parameter {
            body["parameter"] = json!(parameter);
        }
        if let Some(serde_json::Value::Object(extra)) = self.extra {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        let mut response = (self.status, Json(json!({ "error": body }))).into_response();
        response.extensions_mut().insert(code);
        response
    }
}

/// The parameter a serde error is about: `missing field `x`` / `unknown field `x`` name it in
/// backticks; other errors start with its path (`parameters.count: invalid type: ...`).
pub fn parameter_of(serde_message: &str) -> Option<String> {
    let message = serde_message.rsplit_once("target type: ").map(|(_, m)| m).unwrap_or(serde_message);
    let message = message.strip_prefix("Failed to deserialize query string: ").unwrap_or(message);
    for prefix in ["missing field `", "unknown field `"] {
        if let Some(rest) = message.strip_prefix(prefix) {
            return rest.split('`').next().map(str::to_string);
        }
    }
    let (path, _) = message.split_once(": ")?;
    let is_path =
        !path.is_empty() && path.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '-'));
    is_path.then(|| path.to_string())
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::JsonRejection) -> Self {
        use axum::extract::rejection::JsonRejection;
        let text = rejection.body_text();
        match &rejection {
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with 'Content-Type: application/json'",
            ),
            JsonRejection::JsonDataError(_) => match parameter_of(&text) {
                Some(parameter) => ApiError::invalid(&parameter, format!("invalid JSON body: {text}")),
                None => ApiError::bad_request(None, format!("invalid JSON body: {text}")),
            },
            _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("request body too large: {text}"),
            ),
            _ => ApiError::bad_request(None, format!("invalid JSON body: {text}")),
        }
    }
}

/// Refuses text PostgreSQL cannot store (a NUL character) with a 422 naming `field`.
pub fn storable(field: &str, text: &str) -> Result<(), ApiError> {
    if text.contains('\0') {
        return Err(ApiError::invalid(field, format!("'{field}' must not contain a NUL character")));
    }
    Ok(())
}

/// `storable` for every key and string inside a JSON value; the error names the path to it
/// (`parameters.message`, `config.tags[2]`).
pub fn storable_json(field: &str, value: &serde_json::Value) -> Result<(), ApiError> {
    match attune_core::params::nul_path(value, field) {
        Some(path) => Err(ApiError::invalid(&path, format!("'{path}' must not contain a NUL character"))),
        None => Ok(()),
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::BytesRejection) -> Self {
        let text = rejection.body_text();
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("request body too large: {text}"),
            );
        }
        ApiError::bad_request(Some("body"), format!("the body could not be read: {text}"))
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::QueryRejection) -> Self {
        let text = rejection.body_text();
        ApiError::bad_request(parameter_of(&text).as_deref(), format!("invalid query: {text}"))
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::PathRejection) -> Self {
        ApiError::bad_request(Some("id"), format!("invalid path: {}", rejection.body_text()))
    }
}

/// A JSON request body that must be an object, as every body schema of the API says: read as
/// JSON (the framework's rejections become `ApiError`s), refused with 422 unless it is an object
/// (serde would otherwise take `["core.echo"]` for a struct), then read as `T`, a field error
/// naming the field.
pub struct JsonObject<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for JsonObject<T> {
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let Json(value) = Json::<serde_json::Value>::from_request(request, state).await?;
        object_body(value).map(JsonObject)
    }
}

/// `value` as `T`, if it is a JSON object (see `JsonObject`).
pub fn object_body<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::invalid("body", "the request body must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| {
        let message = e.to_string();
        let parameter = parameter_of(&message).unwrap_or_else(|| "body".to_string());
        ApiError::invalid(&parameter, format!("invalid JSON body: {message}"))
    })
}

#[cfg(test)]
mod tests {
    use super::parameter_of;

    #[test]
    fn serde_messages_name_their_parameter() {
        let cases = [
            (
                "Failed to deserialize the JSON body into the target type: missing field `action_ref` at line 1 column 2",
                Some("action_ref"),
            ),
            (
                "Failed to deserialize the JSON body into the target type: action_ref: invalid type: integer `5`, expected a string at line 1 column 17",
                Some("action_ref"),
            ),
            (
                "Failed to deserialize the JSON body into the target type: unknown field `colour`, expected one of `action_ref`",
                Some("colour"),
            ),
            ("Failed to deserialize query string: limit: invalid digit found in string", Some("limit")),
            ("Failed to deserialize the JSON body into the target type: expected value at line 1 column 1", None),
        ];
        for (message, expected) in cases {
            assert_eq!(parameter_of(message).as_deref(), expected, "{message}");
        }
    }
}
