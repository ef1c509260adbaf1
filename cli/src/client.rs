//! A small client for the attune API. An `https://` API is verified against the system's roots
//! plus the CA certificates in `ATTUNE_CA_CERT` (rustls with ring, see `attune_common::tls`).

use anyhow::{Context, anyhow};
use attune_common::settings::{Environment, Source};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub struct Client {
    /// The HTTP client, or why none could be built (a bad `ATTUNE_CA_CERT`), told by the first
    /// request: commands that do not call the API (`up`, `token create`) still work.
    http: Result<reqwest::Client, String>,
    base: String,
    token: Option<String>,
    /// `--reason`: sent with every request that could change state (`X-Attune-Reason`).
    reason: Option<String>,
}

impl Client {
    pub fn new(base: &str, token: Option<String>) -> Self {
        let http = http_client(&Environment).map_err(|e| format!("{e:#}"));
        Client { http, base: base.trim_end_matches('/').to_string(), token, reason: None }
    }

    /// The client, giving `reason` for each change it asks for.
    pub fn with_reason(self, reason: Option<String>) -> Self {
        Client { reason, ..self }
    }

    /// The answer to `method path`, read as `T`: the API's own type of it (an `Answer` of it to
    /// keep the JSON as sent), `Value` for the JSON alone, `IgnoredAny` when nothing of it counts.
    pub async fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&impl Serialize>,
    ) -> anyhow::Result<T> {
        self.request_with_headers(method, path, query, &[], body).await
    }

    /// `request` with extra headers (an `Idempotency-Key`).
    pub async fn request_with_headers<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, String)],
        body: Option<&impl Serialize>,
    ) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.base);
        let http = self.http.as_ref().map_err(|e| anyhow!("{e}"))?;
        let mut request = http.request(method.clone(), &url).query(query);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(reason) = self.reason.as_deref().filter(|_| !matches!(method, Method::GET | Method::HEAD)) {
            request = request.header("X-Attune-Reason", reason);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return Err(unreachable(&self.base, e)),
        };
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return T::deserialize(body).with_context(|| format!("reading the API's answer to {method} {path}"));
        }
        let message = body["error"]["message"].as_str().unwrap_or("no error message");
        let hint = if status == StatusCode::UNAUTHORIZED {
            " (set ATTUNE_TOKEN or --token; create one with `attune token create --name NAME`)"
        } else {
            ""
        };
        Err(anyhow!("{} {}: {message}{hint}", status.as_u16(), status.canonical_reason().unwrap_or("")))
    }

    /// A GET whose answer is read as it comes (a stream of events): the response once its status
    /// is a success, else the API's error.
    pub async fn open_stream(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}{path}", self.base);
        let http = self.http.as_ref().map_err(|e| anyhow!("{e}"))?;
        let mut request = http.get(&url).header("Accept", "text/event-stream");
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| unreachable(&self.base, e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let message = body["error"]["message"].as_str().unwrap_or("no error message");
        Err(anyhow!("{} {}: {message}", status.as_u16(), status.canonical_reason().unwrap_or("")))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        self.request(Method::GET, path, query, None::<&()>).await
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> anyhow::Result<T> {
        self.request(Method::POST, path, &[], Some(body)).await
    }

    pub async fn put<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> anyhow::Result<T> {
        self.request(Method::PUT, path, &[], Some(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.request(Method::DELETE, path, &[], None::<&()>).await
    }
}

/// An answer of the API read as the API's own type `T`, kept with the JSON it came as: what
/// `--output json` prints is that JSON as the API sent it, never `T` written out again (which
/// could drop what `T` does not hold). It derefs to `T`.
#[derive(Debug)]
pub struct Answer<T> {
    json: Value,
    read: T,
}

impl<T: DeserializeOwned> Answer<T> {
    /// `json` read as `T`.
    pub fn read(json: Value) -> Result<Self, serde_json::Error> {
        let read = T::deserialize(&json)?;
        Ok(Answer { json, read })
    }
}

impl<T> Answer<T> {
    /// The JSON as the API sent it.
    pub fn json(&self) -> &Value {
        &self.json
    }
}

impl<T> std::ops::Deref for Answer<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.read
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Answer<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Answer::read(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl<T> Serialize for Answer<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(serializer)
    }
}

fn http_client(source: &dyn Source) -> anyhow::Result<reqwest::Client> {
    attune_common::tls::install_default_provider();
    let mut builder = reqwest::Client::builder();
    if let Some(pem) = attune_common::tls::ca_from(source, "ATTUNE_CA_CERT")? {
        let certificates = reqwest::Certificate::from_pem_bundle(pem.as_bytes()).context("ATTUNE_CA_CERT")?;
        builder = builder.tls_certs_merge(certificates);
    }
    builder.build().context("cannot build the HTTP client")
}

/// Whether a request may have been carried out though no answer came: the connection failed or
/// broke on the way, the answer timed out, or the API answered 503 (unavailable for a moment).
pub fn unanswered(error: &anyhow::Error) -> bool {
    if let Some(e) = error.downcast_ref::<reqwest::Error>() {
        return e.is_connect() || e.is_timeout() || e.is_request() || e.is_body() || e.is_decode();
    }
    error.to_string().starts_with("503 ")
}

/// Why the API at `base` could not be reached; a refused certificate says what to do about it.
fn unreachable(base: &str, error: reqwest::Error) -> anyhow::Error {
    let hint = match attune_common::tls::tls_error(&error) {
        Some(refused @ rustls::Error::InvalidCertificate(_)) => format!(
            " (its TLS certificate was refused: {refused}; if a private CA signed it, set ATTUNE_CA_CERT to that \
             CA's PEM file)"
        ),
        Some(failed) => format!(" (TLS failed: {failed})"),
        None => String::new(),
    };
    anyhow::Error::new(error).context(format!("cannot reach the attune API at {base}{hint}"))
}
