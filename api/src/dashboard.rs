//! The SRE dashboard under `/ui`: one HTML shell, a script and a stylesheet, embedded in the
//! binary (no front-end build). They carry no data, so they are served without a token; the
//! script reads everything from the JSON API with the token the login form keeps in the browser
//! session, and a 401 from the API sends the user back to the login form. Every page goes out
//! with a strict Content-Security-Policy (`script-src 'self'`, no inline script or style).

use axum::Router;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const SHELL_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// Scripts and styles only from this origin, data only from the API on this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The pages (each the same shell; the script renders by path) and their two assets.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/workers") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/workers") }))
        .route("/ui/login", get(shell))
        .route("/ui/workers", get(shell))
        .route("/ui/executions", get(shell))
        .route("/ui/executions/{id}", get(shell))
        .route("/ui/retries", get(shell))
        .route("/ui/assets/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/assets/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
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
