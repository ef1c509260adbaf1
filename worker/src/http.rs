//! `runtime: http` actions: one HTTP request, described by the action's `http:` block, made from
//! the worker itself (no process), bounded by the action's `timeout_seconds` and stopped by a
//! cancel.
//!
//! The request: `{{ name }}` in the URL is URL-encoded, in a header as text (a value with a line
//! break is refused: `invalid_parameters`), in a string body JSON-encoded unless a `Content-Type`
//! header says the body is not JSON; a mapping or list body is sent as JSON
//! (`Content-Type: application/json` unless a header sets one). Every request carries
//! `Idempotency-Key: <the chain's key>` (the same for every attempt of a retry chain) unless the
//! action sets that header itself. Redirects are not followed, and the client never resends a
//! request by itself: retrying is the retry policy's decision.
//!
//! The destination (issue 32): the worker's own loopback and networks are not the action's to
//! reach. Loopback, private, link-local and every other non-global address is refused unless
//! `ATTUNE_WORKER_HTTP_ALLOW` lists it (`crate::destination` has the rule), checked on the
//! address actually connected to: a name is resolved by the client's own resolver
//! (`AdmittedOnly`), which keeps only the addresses admitted and fails a name that has none, and
//! an address written in the URL (which the client does not resolve) is checked before the
//! request. No proxy is used, and since no redirect is followed, no redirect can lead to a
//! refused address. A refusal is `action_failed` before any connection is tried, so it says
//! nothing about the destination (an open port and a closed one answer alike); its error names
//! the host as written and the setting.
//!
//! The outcome: 2xx completes with the result `{"status", "headers", "body"}` (header names in
//! lower case; the body parsed when the response says it is JSON, else its text, cut at the
//! worker's output limit). 429, 5xx, a connection that fails and a timeout are
//! `transient_error`; 400 and 422 are `validation_error`, 401 and 403 `permission_denied`; any
//! other status (another 4xx, a 3xx) is `action_failed`. A response's status is
//! always reported (`http_status`) and its result kept on a failure too; `Retry-After` (seconds
//! or an HTTP date, at most an hour) tells the retry policy the earliest next attempt.
//!
//! Parameter values may be secrets: errors and logs name the URL without its query and a header
//! by its name, never a header's value.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use attune_common::mq::ResultStatus;
use attune_core::FailureKind;
use attune_core::pack::HttpSpec;
use attune_core::template;
use chrono::{DateTime, NaiveDateTime, Utc};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::action::{ActionRun, Outcome, Ran};
use crate::destination::{self, AllowList};

/// The longest wait a `Retry-After` header may ask for; a longer one is cut to this.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The worker's HTTP client: one per worker, its connections pooled across executions.
pub struct HttpClient {
    client: reqwest::Client,
    allow: Arc<AllowList>,
}

impl HttpClient {
    /// A client that reaches global addresses and those `allow` names.
    pub fn new(allow: AllowList) -> Self {
        attune_common::tls::install_default_provider();
        let allow = Arc::new(allow);
        let client = reqwest::Client::builder()
            .user_agent(concat!("attune-worker/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .no_proxy()
            .dns_resolver(AdmittedOnly { allow: allow.clone() })
            .build()
            .expect("the worker's HTTP client builds (no proxy, no redirects, ring installed)");
        HttpClient { client, allow }
    }

    /// Makes the request of `run` (an http action), until it ends, its timeout passes or `abort`
    /// fires.
    pub async fn run(&self, run: &ActionRun<'_>, abort: &CancellationToken) -> Ran {
        let spec = match run.http.map(|http| serde_json::from_value::<HttpSpec>(http.clone())) {
            Some(Ok(spec)) => spec,
            Some(Err(e)) => {
                return failed(FailureKind::ActionFailed, format!("the action's http block is invalid: {e}"));
            }
            None => return failed(FailureKind::ActionFailed, "the dispatch carries no http block".into()),
        };
        let mut request = match Request::build(&spec, run.parameters, run.idempotency_key) {
            Ok(request) => request,
            Err(e) => return failed(FailureKind::InvalidParameters, e),
        };
        // the run's trace goes on with the service called (W3C Trace Context), unless the action
        // sets the header itself
        if let Some(traceparent) = run.traceparent.and_then(|t| reqwest::header::HeaderValue::from_str(t).ok()) {
            request.headers.entry("traceparent").or_insert(traceparent);
        }
        let shown = request.shown_url();
        if request.url.scheme() == "https" {
            return failed(
                FailureKind::ActionFailed,
                format!(
                    "https is not supported for http actions yet (a worker has no setting for the CA to trust): {shown}"
                ),
            );
        }
        let host = request.url.host_str().unwrap_or_default().to_string();
        // an address in the URL is connected to as written, past the resolver: checked here
        let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().ok();
        if literal.is_some_and(|ip| !self.allow.admits(ip)) {
            return failed(FailureKind::ActionFailed, destination::refusal(&host));
        }
        let Request { method, url, headers, body } = request;
        let mut builder = self.client.request(method, url).headers(headers);
        if let Some(body) = body {
            builder = builder.body(body);
        }
        let exchange = async {
            let response = builder.send().await?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = read_bounded(response, run.output_limit).await;
            Ok::<_, reqwest::Error>((status, headers, body))
        };
        let answered = tokio::select! {
            answered = tokio::time::timeout(run.timeout, exchange) => answered,
            _ = abort.cancelled() => {
                return failed(FailureKind::WorkerUnavailable, "the worker shut down while the action was running".into());
            }
        };
        match answered {
            Err(_) => failed(
                FailureKind::TransientError,
                format!("timed out after {} s waiting for {shown}", run.timeout.as_secs_f64()),
            ),
            Ok(Err(e)) if is_refused(&e) => failed(FailureKind::ActionFailed, destination::refusal(&host)),
            Ok(Err(e)) => failed(FailureKind::TransientError, request_error(&e, &shown)),
            Ok(Ok((status, headers, body))) => {
                let response = Response { status, headers: &headers, body, limit: run.output_limit };
                response.ran(&shown, Utc::now())
            }
        }
    }
}

impl Default for HttpClient {
    /// A client that reaches global addresses only.
    fn default() -> Self {
        Self::new(AllowList::default())
    }
}

/// The client's resolver: the system's (`getaddrinfo`, through tokio), keeping only the addresses
/// the allow-list admits, so the client never connects to another; a name with none left fails
/// with `Refused`.
struct AdmittedOnly {
    allow: Arc<AllowList>,
}

impl reqwest::dns::Resolve for AdmittedOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        let name = name.as_str().to_string();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            if resolved.is_empty() {
                return Err(format!("{name} has no address").into());
            }
            let admitted: Vec<SocketAddr> = resolved.into_iter().filter(|address| allow.admits(address.ip())).collect();
            if admitted.is_empty() {
                return Err(Box::new(Refused) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(admitted.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Every address of a name is refused (`AdmittedOnly`).
#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("every address of the name is refused")
    }
}

impl std::error::Error for Refused {}

/// Whether a request failed because its name resolved to refused addresses only.
fn is_refused(error: &reqwest::Error) -> bool {
    std::iter::successors(std::error::Error::source(error), |e| e.source()).any(|e| e.is::<Refused>())
}

/// A rendered request.
#[derive(Debug)]
pub struct Request {
    pub method: reqwest::Method,
    pub url: reqwest::Url,
    pub headers: HeaderMap,
    pub body: Option<Vec<u8>>,
}

impl Request {
    /// Renders `spec` with `parameters` (pure). `Err` says what about the parameters makes the
    /// request impossible (the request's fault: `invalid_parameters`), never a value.
    pub fn build(spec: &HttpSpec, parameters: &Value, idempotency_key: &str) -> Result<Request, String> {
        let method = reqwest::Method::from_bytes(spec.method.as_bytes())
            .map_err(|_| format!("'{}' is not an HTTP method", spec.method))?;
        let rendered = template::render(&spec.url, parameters, template::url_encoded)?;
        let url =
            reqwest::Url::parse(&rendered).map_err(|e| format!("the URL is not valid with these parameters: {e}"))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &spec.headers {
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("'{name}' is not a header name"))?;
            let value = template::render(value, parameters, template::plain)?;
            if value.contains(['\r', '\n']) {
                return Err(format!("header '{name}': a parameter's value contains a line break"));
            }
            let value = HeaderValue::from_str(&value)
                .map_err(|_| format!("header '{name}': a parameter's value has characters a header cannot carry"))?;
            headers.append(header, value);
        }
        let content_type = headers.get(CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = match &spec.body {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => {
                let encode =
                    if content_type.as_deref().is_none_or(is_json) { template::json_encoded } else { template::plain };
                Some(template::render(text, parameters, encode)?.into_bytes())
            }
            Some(structured) => {
                if content_type.is_none() {
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                }
                let rendered = template::render_json(structured, parameters)?;
                Some(serde_json::to_vec(&rendered).expect("a JSON value serializes"))
            }
        };
        if !idempotency_key.is_empty() && !headers.contains_key(IDEMPOTENCY_KEY) {
            let key = HeaderValue::from_str(idempotency_key)
                .map_err(|_| "the idempotency key is not a header value".to_string())?;
            headers.insert(IDEMPOTENCY_KEY, key);
        }
        Ok(Request { method, url, headers, body })
    }

    /// The method and the URL as errors show them.
    fn shown_url(&self) -> String {
        format!("{} {}", self.method, shown_url(&self.url))
    }
}

/// The URL without what may carry a secret: no user or password, query or fragment.
pub fn shown_url(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

/// Whether a media type is JSON (`application/json`, or any `+json` type).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// What a status means for the execution: none for a success, else the failure kind (pure).
pub fn failure_of_status(status: u16) -> Option<FailureKind> {
    match status {
        200..=299 => None,
        429 | 500..=599 => Some(FailureKind::TransientError),
        400 | 422 => Some(FailureKind::ValidationError),
        401 | 403 => Some(FailureKind::PermissionDenied),
        _ => Some(FailureKind::ActionFailed),
    }
}

/// The wait a `Retry-After` value asks for at `now` (pure): delta-seconds or an HTTP date (a past
/// date is no wait), at most `RETRY_AFTER_CAP`; `None` for anything else.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(RETRY_AFTER_CAP));
    }
    let at = http_date(value)?;
    Some((at - now).to_std().unwrap_or(Duration::ZERO).min(RETRY_AFTER_CAP))
}

/// An HTTP date (RFC 9110): IMF-fixdate, or the obsolete RFC 850 and asctime forms.
fn http_date(value: &str) -> Option<DateTime<Utc>> {
    if let Ok(date) = DateTime::parse_from_rfc2822(value) {
        return Some(date.with_timezone(&Utc));
    }
    ["%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(value, format).ok())
        .map(|naive| naive.and_utc())
}

/// A response that came, its body read up to `limit` bytes.
struct Response<'a> {
    status: u16,
    headers: &'a HeaderMap,
    body: Result<Bounded, reqwest::Error>,
    limit: usize,
}

impl Response<'_> {
    /// The run's report for this response (pure but for the body read before).
    fn ran(self, shown: &str, now: DateTime<Utc>) -> Ran {
        let http_status = Some(i32::from(self.status));
        let body = match self.body {
            Ok(body) => body,
            Err(e) => {
                // the status came, the body broke off: the exchange did not complete
                let error = format!("the response body from {shown} broke off: {}", error_chain(&e));
                return Ran { http_status, ..failed(FailureKind::TransientError, error) };
            }
        };
        let result = result_of(self.status, self.headers, &body);
        let cut = body
            .cut
            .then(|| format!("the response body was cut at {} bytes (ATTUNE_WORKER_OUTPUT_LIMIT_BYTES)", self.limit));
        let Some(kind) = failure_of_status(self.status) else {
            let outcome =
                Outcome { status: ResultStatus::Completed, failure_kind: None, error: cut, result: Some(result) };
            return Ran { http_status, ..Ran::of(outcome) };
        };
        let reason = reqwest::StatusCode::from_u16(self.status).ok().and_then(|s| s.canonical_reason());
        let mut error = match reason {
            Some(reason) => format!("HTTP {} {reason} from {shown}", self.status),
            None => format!("HTTP {} from {shown}", self.status),
        };
        if let Some(cut) = cut {
            error = format!("{error}; {cut}");
        }
        let retry_after = self
            .headers
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, now));
        let outcome = Outcome {
            status: ResultStatus::of_failure(kind),
            failure_kind: Some(kind),
            error: Some(error),
            result: Some(result),
        };
        Ran { http_status, retry_after, ..Ran::of(outcome) }
    }
}

/// The execution's result for a response: `{"status", "headers", "body"}`.
fn result_of(status: u16, headers: &HeaderMap, body: &Bounded) -> Value {
    let mut shown = serde_json::Map::new();
    for name in headers.keys() {
        let values: Vec<String> =
            headers.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).collect();
        // HeaderName is lower case already; a credential (a cookie, a token) is never stored
        let value = if attune_core::pack::is_sensitive_header(name.as_str()) {
            attune_common::secrets::REDACTED.to_string()
        } else {
            values.join(", ")
        };
        shown.insert(name.as_str().to_string(), Value::String(value));
    }
    let text = String::from_utf8_lossy(&body.bytes);
    let says_json = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(is_json);
    let body = says_json
        .then(|| serde_json::from_str::<Value>(&text).ok())
        .flatten()
        .unwrap_or_else(|| Value::String(text.into_owned()));
    serde_json::json!({"status": status, "headers": shown, "body": body})
}

/// A response body, its first `limit` bytes.
struct Bounded {
    bytes: Vec<u8>,
    /// More came than the limit: the rest was not read.
    cut: bool,
}

async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Bounded, reqwest::Error> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(Bounded { bytes, cut: true });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Bounded { bytes, cut: false })
}

/// A request that got no response, in words: "connection refused: ..." and the like.
fn request_error(error: &reqwest::Error, shown: &str) -> String {
    let io = std::iter::successors(std::error::Error::source(error), |e| e.source())
        .find_map(|e| e.downcast_ref::<std::io::Error>());
    match io.map(std::io::Error::kind) {
        Some(std::io::ErrorKind::ConnectionRefused) => format!("connection refused: {shown}"),
        Some(std::io::ErrorKind::ConnectionReset) => format!("connection reset: {shown}"),
        _ if error.is_connect() => format!("could not connect: {shown}: {}", error_chain(error)),
        _ => format!("the request failed: {shown}: {}", error_chain(error)),
    }
}

/// An error and its sources, without the URL reqwest would add (its query may hold a secret).
fn error_chain(error: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    if parts.is_empty() {
        parts.push(if error.is_body() { "error reading the body".into() } else { "error sending the request".into() });
    }
    parts.join(": ")
}

fn failed(kind: FailureKind, error: String) -> Ran {
    Ran::of(Outcome {
        status: ResultStatus::of_failure(kind),
        failure_kind: Some(kind),
        error: Some(error),
        result: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_testkit::http_server::{HttpServer, Reply};
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-24T10:00:00Z").unwrap().with_timezone(&Utc)
    }

    /// An http block, as the dispatch carries it (JSON).
    fn spec(json: &str) -> HttpSpec {
        serde_json::from_str(json).unwrap()
    }

    fn response(status: u16, headers: &[(&str, &str)], body: &str) -> Ran {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
        }
        let body = Ok(Bounded { bytes: body.as_bytes().to_vec(), cut: false });
        Response { status, headers: &map, body, limit: 1000 }.ran("GET http://h/p", now())
    }

    #[test]
    fn statuses_are_classified() {
        use FailureKind::{ActionFailed, PermissionDenied, TransientError, ValidationError};
        let table = [
            (200, None),
            (201, None),
            (204, None),
            (301, Some(ActionFailed)),
            (400, Some(ValidationError)),
            (401, Some(PermissionDenied)),
            (403, Some(PermissionDenied)),
            (404, Some(ActionFailed)),
            (422, Some(ValidationError)),
            (409, Some(ActionFailed)),
            (429, Some(TransientError)),
            (500, Some(TransientError)),
            (502, Some(TransientError)),
            (503, Some(TransientError)),
            (504, Some(TransientError)),
        ];
        for (status, kind) in table {
            assert_eq!(failure_of_status(status), kind, "{status}");
            let ran = response(status, &[], "");
            assert_eq!(ran.outcome.failure_kind, kind, "{status}");
            let expected = if kind.is_some() { ResultStatus::Failed } else { ResultStatus::Completed };
            assert_eq!(ran.outcome.status, expected, "{status}");
            assert_eq!(ran.http_status, Some(i32::from(status)));
            assert_eq!(ran.outcome.result.as_ref().unwrap()["status"], status, "the result is kept on failures too");
            assert_eq!(ran.outcome.error.is_some(), kind.is_some(), "{status}");
        }
        assert_eq!(response(503, &[], "").outcome.error.unwrap(), "HTTP 503 Service Unavailable from GET http://h/p");
        assert_eq!(response(599, &[], "").outcome.error.unwrap(), "HTTP 599 from GET http://h/p");
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let at = |text: &str| parse_retry_after(text, now());
        assert_eq!(at("2"), Some(Duration::from_secs(2)));
        assert_eq!(at(" 0 "), Some(Duration::ZERO));
        assert_eq!(at("86400"), Some(RETRY_AFTER_CAP), "capped at an hour");
        assert_eq!(at("99999999999999999999999"), Some(RETRY_AFTER_CAP));
        assert_eq!(at("Tue, 24 Nov 2026 10:00:30 GMT"), Some(Duration::from_secs(30)));
        assert_eq!(at("Tuesday, 24-Nov-26 10:01:00 GMT"), Some(Duration::from_secs(60)), "RFC 850");
        assert_eq!(at("Tue Nov 24 10:00:05 2026"), Some(Duration::from_secs(5)), "asctime");
        assert_eq!(at("Tue, 24 Nov 2026 09:00:00 GMT"), Some(Duration::ZERO), "a past date: no wait");
        assert_eq!(at("Wed, 25 Nov 2026 10:00:00 GMT"), Some(RETRY_AFTER_CAP));
        for garbage in ["", "soon", "-5", "1.5", "2s", "+3", "Tue, 99 Nov 2026 10:00:00 GMT"] {
            assert_eq!(at(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn retry_after_is_reported_for_failures() {
        let ran = response(429, &[("Retry-After", "7")], "");
        assert_eq!(ran.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(response(503, &[("Retry-After", "later")], "").retry_after, None);
        assert_eq!(response(200, &[("Retry-After", "7")], "").retry_after, None, "a success has no next attempt");
    }

    #[test]
    fn the_result_has_status_lowercased_headers_and_the_body() {
        let ran =
            response(200, &[("Content-Type", "application/json"), ("X-Thing", "a"), ("x-thing", "b")], r#"{"id": 5}"#);
        assert_eq!(
            ran.outcome.result.unwrap(),
            json!({"status": 200, "headers": {"content-type": "application/json", "x-thing": "a, b"}, "body": {"id": 5}})
        );
        let ran = response(200, &[("Content-Type", "application/problem+json; charset=utf-8")], r#"[1]"#);
        assert_eq!(ran.outcome.result.unwrap()["body"], json!([1]));
        let ran = response(200, &[("Content-Type", "text/plain")], r#"{"id": 5}"#);
        assert_eq!(ran.outcome.result.unwrap()["body"], r#"{"id": 5}"#, "not JSON unless it says so");
        let ran = response(200, &[("Content-Type", "application/json")], "{cut");
        assert_eq!(ran.outcome.result.unwrap()["body"], "{cut", "JSON that does not parse stays text");
    }

    #[test]
    fn values_are_encoded_for_where_they_stand() {
        let params = json!({"text": "a b/&?#\"", "token": "s3cret", "n": 3});
        let spec = spec(
            r#"{"method": "POST", "url": "http://h:8080/items/{{ text }}?q={{text}}&n={{ n }}",
                "headers": {"Authorization": "Bearer {{ token }}"},
                "body": {"text": "{{ text }}", "n": "{{ n }}", "note": "n is {{ n }}"}}"#,
        );
        let request = Request::build(&spec, &params, "chain-key").unwrap();
        assert_eq!(request.method, reqwest::Method::POST);
        assert_eq!(request.url.path(), "/items/a%20b%2F%26%3F%23%22");
        assert_eq!(request.url.query(), Some("q=a%20b%2F%26%3F%23%22&n=3"));
        assert_eq!(request.headers["authorization"], "Bearer s3cret");
        assert_eq!(request.headers["content-type"], "application/json");
        assert_eq!(request.headers["idempotency-key"], "chain-key");
        let body: Value = serde_json::from_slice(request.body.as_ref().unwrap()).unwrap();
        assert_eq!(body, json!({"text": "a b/&?#\"", "n": 3, "note": "n is 3"}));
        assert_eq!(request.shown_url(), "POST http://h:8080/items/a%20b%2F%26%3F%23%22", "no query in errors");
    }

    #[test]
    fn a_string_body_is_json_encoded_unless_the_content_type_says_otherwise() {
        let params = json!({"text": "say \"hi\"\n"});
        let json_body = spec(r#"{"url": "http://h/", "body": "{\"text\": {{ text }}}"}"#);
        let request = Request::build(&json_body, &params, "").unwrap();
        let body: Value = serde_json::from_slice(request.body.as_ref().unwrap()).unwrap();
        assert_eq!(body, json!({"text": "say \"hi\"\n"}));
        assert_eq!(request.method, reqwest::Method::GET);
        assert!(!request.headers.contains_key("content-type"), "a string body is sent as written");
        assert!(!request.headers.contains_key("idempotency-key"), "no key, no header");

        let text_body =
            spec(r#"{"url": "http://h/", "headers": {"content-type": "text/plain"}, "body": "text: {{ text }}"}"#);
        let request = Request::build(&text_body, &params, "k").unwrap();
        assert_eq!(request.body.unwrap(), b"text: say \"hi\"\n");

        let own_type = spec(
            r#"{"url": "http://h/", "headers": {"Content-Type": "application/vnd.x+json", "Idempotency-Key": "mine-{{ text }}"}, "body": {"a": 1}}"#,
        );
        let request = Request::build(&own_type, &json!({"text": "x"}), "chain-key").unwrap();
        assert_eq!(request.headers["content-type"], "application/vnd.x+json");
        assert_eq!(request.headers.get_all("idempotency-key").iter().collect::<Vec<_>>(), ["mine-x"]);
    }

    #[test]
    fn a_header_value_with_a_line_break_is_refused_without_showing_it() {
        let spec = spec(r#"{"url": "http://h/", "headers": {"X-Note": "{{ note }}"}}"#);
        for bad in ["a\r\nX-Admin: yes", "a\nb", "a\u{7f}b"] {
            let error = Request::build(&spec, &json!({"note": bad}), "k").unwrap_err();
            assert!(error.starts_with("header 'X-Note'"), "{error}");
            assert!(!error.contains("Admin") && !error.contains("a\n"), "the value is not shown: {error}");
        }
        assert!(Request::build(&spec, &json!({"note": "tab\tok"}), "k").is_ok());
    }

    #[test]
    fn an_invalid_url_after_rendering_is_the_requests_fault() {
        let spec = spec(r#"{"url": "http://127.0.0.1:{{ port }}/"}"#);
        assert!(Request::build(&spec, &json!({"port": 8080}), "").is_ok());
        let error = Request::build(&spec, &json!({"port": "http"}), "").unwrap_err();
        assert!(error.contains("not valid"), "{error}");
    }

    #[test]
    fn shown_urls_carry_no_secrets() {
        let url = reqwest::Url::parse("http://user:pw@h:1/a/b?token=s3cret#frag").unwrap();
        assert_eq!(shown_url(&url), "http://h:1/a/b");
    }

    /// A client allowed to reach 127.0.0.1, where the test servers listen.
    fn loopback_client() -> HttpClient {
        HttpClient::new(AllowList::parse("127.0.0.1/32").unwrap())
    }

    fn run_of<'a>(http: &'a Value, parameters: &'a Value, timeout: Duration, limit: usize) -> ActionRun<'a> {
        ActionRun {
            execution_id: 1,
            action_ref: "test.http",
            runtime: "http",
            pack_path: std::path::PathBuf::new(),
            entrypoint: "",
            parameters,
            timeout,
            retry_count: 0,
            output_limit: limit,
            transient_exit_codes: &[],
            http: Some(http),
            idempotency_key: "chain-1",
            limits: None,
            kill: None,
            traceparent: None,
            capture: None,
        }
    }

    #[tokio::test]
    async fn a_request_reaches_the_server_and_its_answer_is_reported() {
        let server = HttpServer::start().await;
        server.script(
            "/things/a%20b",
            [
                Reply::status(503).header("Retry-After", "3").body("busy"),
                Reply::status(201).json(&json!({"id": 9})).header("X-Request", "r1"),
            ],
        );
        let http = json!({"method": "PUT", "url": server.url("/things/{{ name }}?secret={{ secret }}"), "body": {"name": "{{ name }}"}});
        let params = json!({"name": "a b", "secret": "s3cret"});
        let client = loopback_client();
        let first = client.run(&run_of(&http, &params, Duration::from_secs(10), 1000), &CancellationToken::new()).await;
        assert_eq!(first.outcome.failure_kind, Some(FailureKind::TransientError), "{first:?}");
        assert_eq!((first.http_status, first.retry_after), (Some(503), Some(Duration::from_secs(3))));
        let error = first.outcome.error.unwrap();
        assert_eq!(error, format!("HTTP 503 Service Unavailable from PUT {}", server.url("/things/a%20b")));
        assert_eq!(first.outcome.result.unwrap()["body"], "busy");

        let second =
            client.run(&run_of(&http, &params, Duration::from_secs(10), 1000), &CancellationToken::new()).await;
        assert_eq!(second.outcome.status, ResultStatus::Completed, "{second:?}");
        let result = second.outcome.result.unwrap();
        assert_eq!((result["status"].as_u64(), &result["body"]), (Some(201), &json!({"id": 9})));
        assert_eq!(result["headers"]["x-request"], "r1");

        let got = server.requests_to("/things/a%20b");
        assert_eq!(got.len(), 2);
        for request in &got {
            assert_eq!((request.method.as_str(), request.query()), ("PUT", Some("secret=s3cret")));
            assert_eq!(request.header("idempotency-key"), Some("chain-1"));
            assert_eq!(request.header("content-type"), Some("application/json"));
            assert_eq!(serde_json::from_slice::<Value>(&request.body).unwrap(), json!({"name": "a b"}));
        }
    }

    #[tokio::test]
    async fn a_long_body_is_cut_at_the_output_limit() {
        let server = HttpServer::start().await;
        server.script("/big", [Reply::status(200).body(vec![b'x'; 200_000])]);
        let http = json!({"url": server.url("/big")});
        let params = json!({});
        let ran = loopback_client()
            .run(&run_of(&http, &params, Duration::from_secs(10), 1000), &CancellationToken::new())
            .await;
        assert_eq!(ran.outcome.status, ResultStatus::Completed);
        assert_eq!(ran.outcome.result.unwrap()["body"].as_str().unwrap().len(), 1000);
        let error = ran.outcome.error.unwrap();
        assert!(error.contains("cut at 1000 bytes"), "{error}");
    }

    #[tokio::test]
    async fn no_answer_in_time_is_a_transient_timeout() {
        let server = HttpServer::start().await;
        server.script("/slow", [Reply::status(200).after(Duration::from_secs(30))]);
        let http = json!({"url": server.url("/slow?token={{ token }}")});
        let params = json!({"token": "s3cret"});
        let started = std::time::Instant::now();
        let ran = loopback_client()
            .run(&run_of(&http, &params, Duration::from_millis(300), 1000), &CancellationToken::new())
            .await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!((ran.outcome.failure_kind, ran.http_status), (Some(FailureKind::TransientError), None));
        let error = ran.outcome.error.unwrap();
        assert_eq!(error, format!("timed out after 0.3 s waiting for GET {}", server.url("/slow")));
    }

    #[tokio::test]
    async fn a_cancel_aborts_the_request() {
        let server = HttpServer::start().await;
        server.script("/hang", [Reply::status(200).after(Duration::from_secs(60))]);
        let http = json!({"url": server.url("/hang")});
        let params = json!({});
        let cancel = CancellationToken::new();
        let client = loopback_client();
        let run = run_of(&http, &params, Duration::from_secs(60), 1000);
        let running = client.run(&run, &cancel);
        let canceling = async {
            server.wait_requests("/hang", 1, Duration::from_secs(10)).await;
            cancel.cancel();
        };
        let started = std::time::Instant::now();
        let (ran, ()) = tokio::join!(running, canceling);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(ran.outcome.failure_kind, Some(FailureKind::WorkerUnavailable), "{ran:?}");
        attune_testkit::wait_for("the server to see the client hang up", Duration::from_secs(10), || async {
            (server.hung_up("/hang") == 1).then_some(())
        })
        .await;
    }

    #[tokio::test]
    async fn a_refused_connection_is_transient_and_says_so() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let http = json!({"url": format!("http://127.0.0.1:{port}/x?key={{{{ key }}}}")});
        let params = json!({"key": "s3cret"});
        let ran = loopback_client()
            .run(&run_of(&http, &params, Duration::from_secs(10), 1000), &CancellationToken::new())
            .await;
        assert_eq!((ran.outcome.failure_kind, ran.http_status), (Some(FailureKind::TransientError), None));
        let error = ran.outcome.error.unwrap();
        assert_eq!(error, format!("connection refused: GET http://127.0.0.1:{port}/x"));
    }

    #[tokio::test]
    async fn https_and_bad_parameters_fail_without_a_request() {
        let params = json!({"note": "a\nb"});
        let https = json!({"url": "https://example.invalid/"});
        let ran = loopback_client()
            .run(&run_of(&https, &params, Duration::from_secs(10), 1000), &CancellationToken::new())
            .await;
        assert_eq!(ran.outcome.failure_kind, Some(FailureKind::ActionFailed));
        assert!(ran.outcome.error.unwrap().contains("https is not supported"));
        let header = json!({"url": "http://127.0.0.1:9/", "headers": {"X-Note": "{{ note }}"}});
        let ran = loopback_client()
            .run(&run_of(&header, &params, Duration::from_secs(10), 1000), &CancellationToken::new())
            .await;
        assert_eq!(ran.outcome.failure_kind, Some(FailureKind::InvalidParameters));
    }

    #[tokio::test]
    async fn a_non_global_destination_is_refused_without_a_connection() {
        let server = HttpServer::start().await;
        server.script("/secret", [Reply::status(200).body("the secret")]);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let open = server.port();
        let params = json!({});
        let client = HttpClient::default();
        let refused = async |url: String| {
            let http = json!({"url": url});
            client.run(&run_of(&http, &params, Duration::from_secs(10), 1000), &CancellationToken::new()).await
        };
        let cases = [
            (format!("http://127.0.0.1:{open}/secret"), "127.0.0.1"),
            (format!("http://127.0.0.1:{closed}/secret"), "127.0.0.1"),
            (format!("http://0x7f.1:{open}/secret"), "127.0.0.1"),
            (format!("http://[::1]:{open}/secret"), "[::1]"),
            (format!("http://[::ffff:127.0.0.1]:{open}/secret"), "[::ffff:7f00:1]"),
            (format!("http://localhost:{open}/secret"), "localhost"),
            (format!("http://LocalHost:{closed}/secret"), "localhost"),
            ("http://169.254.169.254/latest/meta-data/".to_string(), "169.254.169.254"),
            ("http://10.0.0.1:5432/".to_string(), "10.0.0.1"),
        ];
        for (url, host) in cases {
            let ran = refused(url.clone()).await;
            assert_eq!((ran.outcome.failure_kind, ran.http_status), (Some(FailureKind::ActionFailed), None), "{url}");
            assert_eq!(ran.outcome.status, ResultStatus::Failed);
            assert_eq!(ran.outcome.result, None);
            assert_eq!(ran.outcome.error.unwrap(), destination::refusal(host), "{url}");
        }
        assert!(server.requests().is_empty(), "nothing reached the server: {:?}", server.requests());
    }

    #[tokio::test]
    async fn the_resolver_keeps_only_admitted_addresses() {
        let localhost = || "localhost".parse::<reqwest::dns::Name>().unwrap();
        let none = AdmittedOnly { allow: Arc::new(AllowList::default()) };
        use reqwest::dns::Resolve;
        let error = none.resolve(localhost()).await.err().expect("every address of localhost is refused");
        assert!(error.is::<Refused>(), "{error}");
        let v4 = AdmittedOnly { allow: Arc::new(AllowList::parse("127.0.0.0/8").unwrap()) };
        let addresses: Vec<SocketAddr> = v4.resolve(localhost()).await.unwrap().collect();
        assert!(!addresses.is_empty());
        assert!(addresses.iter().all(|a| a.ip().is_ipv4() && a.ip().is_loopback()), "no ::1: {addresses:?}");
        let global = AdmittedOnly { allow: Arc::new(AllowList::default()) };
        let error = global.resolve("name.invalid".parse().unwrap()).await.err().unwrap();
        assert!(!error.is::<Refused>(), "a name that does not resolve is not a refusal: {error}");
    }

    #[tokio::test]
    async fn an_allowed_name_is_reached() {
        let server = HttpServer::start().await;
        server.script("/ok", [Reply::status(200).body("fine")]);
        let http = json!({"url": format!("http://localhost:{}/ok", server.port())});
        let params = json!({});
        let ran = loopback_client()
            .run(&run_of(&http, &params, Duration::from_secs(10), 1000), &CancellationToken::new())
            .await;
        assert_eq!(ran.outcome.status, ResultStatus::Completed, "{ran:?}");
        assert_eq!(server.requests_to("/ok").len(), 1);
    }
}
