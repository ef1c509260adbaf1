//! A small client for the attune API.

use anyhow::{Context, anyhow};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    pub fn new(base: &str, token: Option<String>) -> Self {
        Client { http: reqwest::Client::new(), base: base.trim_end_matches('/').to_string(), token }
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&impl Serialize>,
    ) -> anyhow::Result<Value> {
        self.request_with_headers(method, path, query, &[], body).await
    }

    /// `request` with extra headers (an `Idempotency-Key`).
    pub async fn request_with_headers(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, String)],
        body: Option<&impl Serialize>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url).query(query);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.with_context(|| format!("cannot reach the attune API at {}", self.base))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let message = body["error"]["message"].as_str().unwrap_or("no error message");
        let hint = if status == StatusCode::UNAUTHORIZED {
            " (set ATTUNE_TOKEN or --token; create one with `attune token create --name NAME`)"
        } else {
            ""
        };
        Err(anyhow!("{} {}: {message}{hint}", status.as_u16(), status.canonical_reason().unwrap_or("")))
    }

    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.request(Method::GET, path, query, None::<&()>).await
    }

    pub async fn post(&self, path: &str, body: &impl Serialize) -> anyhow::Result<Value> {
        self.request(Method::POST, path, &[], Some(body)).await
    }
}
