//! The SRE dashboard under `/ui`: one HTML shell, a stylesheet and a few script modules, embedded
//! in the binary (no front-end build). They carry no data, so they are served without a token; the
//! script reads everything from the JSON API with the token the login form keeps in the browser
//! session, and a 401 from the API sends the user back to the login form. Every page goes out
//! with a strict Content-Security-Policy (`script-src 'self'`, no inline script or style).

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::ApiError;

const SHELL_HTML: &str = include_str!("dashboard/index.html");

/// `/ui/assets/<name>`: the stylesheet and the script modules (`main.js` imports the others).
const ASSETS: [(&str, &str, &str); 14] = [
    ("app.css", "text/css; charset=utf-8", include_str!("dashboard/app.css")),
    ("main.js", JAVASCRIPT, include_str!("dashboard/main.js")),
    ("dom.js", JAVASCRIPT, include_str!("dashboard/dom.js")),
    ("api.js", JAVASCRIPT, include_str!("dashboard/api.js")),
    ("login.js", JAVASCRIPT, include_str!("dashboard/login.js")),
    ("workers.js", JAVASCRIPT, include_str!("dashboard/workers.js")),
    ("executions.js", JAVASCRIPT, include_str!("dashboard/executions.js")),
    ("live.js", JAVASCRIPT, include_str!("dashboard/live.js")),
    ("retries.js", JAVASCRIPT, include_str!("dashboard/retries.js")),
    ("charts.js", JAVASCRIPT, include_str!("dashboard/charts.js")),
    ("audit.js", JAVASCRIPT, include_str!("dashboard/audit.js")),
    ("schedules.js", JAVASCRIPT, include_str!("dashboard/schedules.js")),
    ("events.js", JAVASCRIPT, include_str!("dashboard/events.js")),
    ("actions.js", JAVASCRIPT, include_str!("dashboard/actions.js")),
];
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// Scripts and styles only from this origin, data only from the API on this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The pages (each the same shell; the script renders by path) and their assets.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        // (the address alone, as a browser is given it, is the dashboard too)
        .route("/", get(|| async { Redirect::to("/ui/workers") }))
        .route("/ui", get(|| async { Redirect::to("/ui/workers") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/workers") }))
        .route("/ui/login", get(shell))
        .route("/ui/workers", get(shell))
        .route("/ui/executions", get(shell))
        .route("/ui/executions/{id}", get(shell))
        .route("/ui/retries", get(shell))
        .route("/ui/audit", get(shell))
        .route("/ui/schedules", get(shell))
        .route("/ui/events", get(shell))
        .route("/ui/actions", get(shell))
        .route("/ui/actions/{ref}", get(shell))
        .route("/ui/assets/{name}", get(asset_named))
}

async fn asset_named(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(asset_name, _, _)| *asset_name == name) {
        Some((_, content_type, body)) => asset(content_type, body),
        None => ApiError::not_found("asset", format!("no dashboard asset '{name}'")).into_response(),
    }
}

async fn shell() -> Response {
    asset("text/html; charset=utf-8", SHELL_HTML)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // the assets change with the binary; revalidating them is cheap
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin")),
    ];
    (headers, body).into_response()
}
