//! The `Idempotency-Key` header of `POST /api/v1/executions`: reading it, submitting under it, and
//! what an earlier request with the same key says to answer. The records are `db::idempotency`'s.
//!
//! The policy: for 24 hours (`db::idempotency::KEY_LIFETIME`) a key a token has sent names the
//! execution its first request created. The same key with the same body (compared as canonical
//! JSON, so layout and key order do not matter) is answered 200 with that execution, and nothing is
//! created or published; with another body, 409. Another token's keys are its own.

use attune_common::db::{self, execution::Execution};
use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use serde_json::json;

use super::CreateExecution;
use crate::ApiError;

pub const HEADER: &str = "Idempotency-Key";

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// The request's `Idempotency-Key`, if it sent one: 1 to 255 visible ASCII characters, once.
/// Anything else is a 400 naming the header.
pub fn key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let malformed = |message: String| ApiError::bad_request(Some(HEADER), message);
    if values.next().is_some() {
        return Err(malformed(format!("send the {HEADER} header once")));
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return Err(malformed(format!("the {HEADER} header must not be empty")));
    }
    if bytes.len() > MAX_KEY_BYTES {
        return Err(malformed(format!(
            "the {HEADER} header takes {} bytes, more than the limit of {MAX_KEY_BYTES}",
            bytes.len()
        )));
    }
    if !bytes.iter().all(u8::is_ascii_graphic) {
        return Err(malformed(format!(
            "the {HEADER} header must be visible ASCII characters only (no spaces, control or non-ASCII characters)"
        )));
    }
    Ok(Some(String::from_utf8(bytes.to_vec()).expect("visible ASCII is UTF-8")))
}

/// A submission that sent a key: the caller's token, the key and the hash of the request.
pub struct Keyed {
    pub token: i64,
    pub key: String,
    pub request_sha256: Vec<u8>,
}

impl Keyed {
    pub fn new(token: i64, key: String, body: &CreateExecution) -> Keyed {
        Keyed { token, key, request_sha256: request_sha256(body) }
    }

    /// Submits `body` under this key: the first time, inserts its execution, the key's record and
    /// the request's audit row in one transaction (201); a repeat is answered from the record
    /// (200, or 409 for another body), and creates, publishes and audits nothing (the audit
    /// middleware writes its row).
    pub async fn submit(
        &self,
        state: &crate::AppState,
        withdrawal: &crate::server::Withdrawal,
        asking: &crate::audit::Asking,
        body: CreateExecution,
        span: &mut attune_common::trace::Span,
    ) -> Result<(StatusCode, Json<Execution>), ApiError> {
        if let Some(first) = self.earlier(state).await? {
            return Ok((StatusCode::OK, Json(first)));
        }
        // A request racing this one with the same key waits in `claim` until this transaction
        // ends, then finds the key taken, rolls back its own execution and answers with this one.
        let created = async {
            let new = super::traced(super::plan(state, body).await?, span);
            let mut transaction = state.db.begin().await?;
            let execution = super::insert(state, &mut *transaction, &new, self.token).await?;
            let claimed =
                db::idempotency::claim(&mut *transaction, self.token, &self.key, &self.request_sha256, execution.id)
                    .await?;
            if !claimed {
                return Ok(None);
            }
            // the request timed out meanwhile and was answered 503: nothing is written (the
            // transaction rolls back); otherwise it waits for the commit, however late
            if !withdrawal.begin_write() {
                return Err(ApiError::request_timeout(state.settings.http.request_timeout));
            }
            let target = crate::audit::Target::new(format!("execution:{}", execution.id));
            // (the answer names the execution again: `audited`, marked written by `create`)
            let _written = asking.commit(transaction, StatusCode::CREATED, target).await?;
            Ok::<_, ApiError>(Some(execution))
        }
        .await;
        match created {
            Ok(Some(execution)) => {
                if let Err(e) = db::idempotency::delete_expired(&state.db, db::idempotency::CLEANUP_BATCH).await {
                    tracing::warn!(error = %e, "could not delete expired idempotency keys; a later submission will");
                }
                super::count_manual_retry(&execution);
                Ok((StatusCode::CREATED, Json(execution)))
            }
            Ok(None) => match self.earlier(state).await? {
                Some(first) => Ok((StatusCode::OK, Json(first))),
                // only if the winner's record expired or its execution was deleted meanwhile
                None => Err(ApiError::unavailable("the Idempotency-Key was released meanwhile; try again")),
            },
            // A request that loses a race can fail for the winner's sake (a manual retry finds
            // the execution already retried): if a request with this key has won meanwhile, its
            // record is the answer.
            Err(error) => match self.earlier(state).await {
                Ok(Some(first)) => Ok((StatusCode::OK, Json(first))),
                Err(reused) if reused.code == REUSED => Err(reused),
                Ok(None) | Err(_) => Err(error),
            },
        }
    }

    /// What a live record of this key says: the execution its first request created when this
    /// request is the same (`Some`), a 409 when it is not; `None` when the key is free.
    pub async fn earlier(&self, state: &crate::AppState) -> Result<Option<Execution>, ApiError> {
        let Some(record) = db::idempotency::find(&state.db, self.token, &self.key).await? else {
            return Ok(None);
        };
        if record.request_sha256 != self.request_sha256 {
            return Err(reused(&self.key, record.execution));
        }
        // the record goes with its execution (ON DELETE CASCADE), so this finds it
        let execution = db::execution::get(&state.db, record.execution).await?;
        if let Some(execution) = &execution {
            tracing::info!(
                execution_id = execution.id,
                token_id = self.token,
                "idempotent repeat answered with the first execution"
            );
        }
        Ok(execution)
    }
}

/// The 409 for a key sent again with another request body.
pub fn reused(key: &str, execution_id: i64) -> ApiError {
    let mut error = ApiError::new(
        StatusCode::CONFLICT,
        REUSED,
        format!(
            "the {HEADER} '{key}' was already used with a different request body, for execution {execution_id}; \
             use a new key for a new request"
        ),
    )
    .with_extra(json!({ "execution_id": execution_id }));
    error.parameter = Some(HEADER.to_string());
    error
}

/// The error code of `reused`.
pub const REUSED: &str = "idempotency_key_reused";

/// The hash that tells two requests apart: of the parsed body, as canonical JSON. A field left out
/// and a field sent as `null` mean the same, so they hash the same.
fn request_sha256(body: &CreateExecution) -> Vec<u8> {
    let request = json!({
        "action_ref": body.action_ref,
        "parameters": body.parameters,
        "config": body.config,
    });
    db::idempotency::request_sha256(&request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(HEADER, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_key_is_one_to_255_visible_ascii_characters_sent_once() {
        assert_eq!(key(&headers(&[])).unwrap(), None);
        let longest = "k".repeat(MAX_KEY_BYTES);
        for good in ["a", "order-42", "5f0c1e9a-7b7e-4a53-9b0e-0d6c1f7c9e21", "!~\"#{}", longest.as_str()] {
            assert_eq!(key(&headers(&[good.as_bytes()])).unwrap().as_deref(), Some(good), "{good}");
        }
        let too_long = "k".repeat(MAX_KEY_BYTES + 1);
        let bad: [&[u8]; 6] = [b"", too_long.as_bytes(), b"two words", b"tab\there", "caf\u{e9}".as_bytes(), b"\x80"];
        for value in bad {
            let error = key(&headers(&[value])).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{value:?}");
            assert_eq!(error.parameter.as_deref(), Some(HEADER), "{value:?}");
        }
        let twice = key(&headers(&[b"a", b"a"])).unwrap_err();
        assert_eq!((twice.status, twice.parameter.as_deref()), (StatusCode::BAD_REQUEST, Some(HEADER)));
    }

    #[test]
    fn left_out_and_null_hash_alike_and_an_empty_object_does_not() {
        let body = |parameters, config| CreateExecution { action_ref: "core.echo".into(), parameters, config };
        let absent = request_sha256(&body(None, None));
        assert_eq!(absent, request_sha256(&body(Some(serde_json::Value::Null), Some(serde_json::Value::Null))));
        // `{}` differs from no parameters for a manual retry (which then keeps the retried ones)
        assert_ne!(absent, request_sha256(&body(Some(json!({})), None)));
        assert_ne!(absent, request_sha256(&body(None, Some(json!({"retry_of": 1})))));
    }
}
