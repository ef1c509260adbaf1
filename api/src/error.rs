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
            _ => "not_found",
        };
        Self::new(StatusCode::NOT_FOUND, code, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
    pub fn internal(context: &str, error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "{context}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("{context}; see the server log"))
    }
    pub fn with_extra(mut self, extra: serde_json::Value) -> Self {
        self.extra = Some(extra);
        self
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        match error {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                tracing::error!(%error, "database unavailable");
                ApiError::unavailable("the database is unavailable; try again")
            }
            other => ApiError::internal("database query failed", other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"code": self.code, "message": self.message});
        if let Some(parameter) = self.parameter {
            body["parameter"] = json!(parameter);
        }
        if let Some(serde_json::Value::Object(extra)) = self.extra {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        (self.status, Json(json!({ "error": body }))).into_response()
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::JsonRejection) -> Self {
        let text = rejection.body_text();
        // serde's message names the field, e.g. "missing field `action_ref`"
        let parameter = text.split('`').nth(1).map(str::to_string);
        let mut error = ApiError::bad_request(None, format!("invalid JSON body: {text}"));
        if let Some(parameter) = parameter {
            error.status = StatusCode::UNPROCESSABLE_ENTITY;
            error.code = "invalid_parameter";
            error.parameter = Some(parameter);
        }
        error
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::QueryRejection) -> Self {
        let text = rejection.body_text();
        let parameter = text.split('`').nth(1);
        ApiError::bad_request(parameter, format!("invalid query: {text}"))
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::PathRejection) -> Self {
        ApiError::bad_request(Some("id"), format!("invalid path: {}", rejection.body_text()))
    }
}
