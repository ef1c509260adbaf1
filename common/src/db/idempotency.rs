//! The `Idempotency-Key` records of `POST /api/v1/executions` (table `api_idempotency_key`): per
//! API token and key, the execution the key's first request created and a hash of that request,
//! for `KEY_LIFETIME`.
//!
//! A submission with a key inserts its execution and `claim`s the key in one transaction. Two
//! requests racing with one key both insert; the second `claim` waits on the primary key until
//! the first transaction ends, then finds the key taken: that request rolls back (its execution
//! was never committed) and answers with the winner's execution, read with `find`.

use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::PgExecutor;

/// How long a key names its execution: 24 hours. After that the key is free again.
pub const KEY_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// How many expired records `delete_expired` removes at a time (see there).
pub const CLEANUP_BATCH: i64 = 16;

/// What a live key recorded.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Record {
    /// The execution the key's first request created.
    pub execution: i64,
    /// `request_sha256` of that request.
    pub request_sha256: Vec<u8>,
}

fn lifetime_secs() -> f64 {
    KEY_LIFETIME.as_secs_f64()
}

/// The live record of `key` for the token `token`, if any (an expired one is not).
pub async fn find(db: impl PgExecutor<'_>, token: i64, key: &str) -> Result<Option<Record>, sqlx::Error> {
    sqlx::query_as(
        "SELECT execution, request_sha256 FROM api_idempotency_key \
         WHERE token = $1 AND key = $2 AND created > now() - make_interval(secs => $3)",
    )
    .bind(token)
    .bind(key)
    .bind(lifetime_secs())
    .fetch_optional(db)
    .await
}

/// Records that `key` of `token` created `execution`, in the transaction that inserted it, and
/// returns `true`; an expired record of the key is replaced. Returns `false`, recording nothing,
/// when a live record holds the key: one committed by a concurrent request, which this one waited
/// for (the caller rolls back and answers with `find`).
pub async fn claim(
    db: impl PgExecutor<'_>,
    token: i64,
    key: &str,
    request_sha256: &[u8],
    execution: i64,
) -> Result<bool, sqlx::Error> {
    let claimed: Option<i64> = sqlx::query_scalar(
        "INSERT INTO api_idempotency_key AS k (token, key, request_sha256, execution) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (token, key) DO UPDATE \
             SET request_sha256 = EXCLUDED.request_sha256, execution = EXCLUDED.execution, created = now() \
             WHERE k.created <= now() - make_interval(secs => $5) \
         RETURNING execution",
    )
    .bind(token)
    .bind(key)
    .bind(request_sha256)
    .bind(execution)
    .bind(lifetime_secs())
    .fetch_optional(db)
    .await?;
    Ok(claimed.is_some())
}

/// Deletes up to `limit` expired records, oldest first, skipping rows another transaction holds;
/// returns how many. Called after each new keyed submission with `CLEANUP_BATCH`, this bounds the
/// table with no job of its own: while any record is expired, each new key removes several, so
/// the table holds about one `KEY_LIFETIME` of keys; when none is, it costs one probe of the
/// `created` index. (A reused key's own expired record is replaced by `claim`.)
pub async fn delete_expired(db: impl PgExecutor<'_>, limit: i64) -> Result<u64, sqlx::Error> {
    sqlx::query(
        "DELETE FROM api_idempotency_key WHERE (token, key) IN ( \
             SELECT token, key FROM api_idempotency_key \
             WHERE created <= now() - make_interval(secs => $1) \
             ORDER BY created LIMIT $2 FOR UPDATE SKIP LOCKED)",
    )
    .bind(lifetime_secs())
    .bind(limit)
    .execute(db)
    .await
    .map(|done| done.rows_affected())
}

/// SHA-256 of `request` as canonical JSON (object keys sorted, no whitespace), so that two bodies
/// that differ only in layout or key order hash the same.
pub fn request_sha256(request: &Value) -> Vec<u8> {
    let mut text = String::new();
    canonical_json(request, &mut text);
    Sha256::digest(text.as_bytes()).to_vec()
}

fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (n, (key, value)) in entries.into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical_json(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn layout_and_key_order_do_not_change_the_hash() {
        let a = parsed(r#"{"action_ref":"core.echo","parameters":{"message":"hi","count":2,"tags":["a","b"]}}"#);
        let b = parsed(
            r#"{
                "parameters": {"tags": [ "a", "b" ], "count": 2, "message": "hi"},
                "action_ref": "core.echo"
            }"#,
        );
        assert_eq!(request_sha256(&a), request_sha256(&b));
        assert_eq!(request_sha256(&a).len(), 32);
    }

    #[test]
    fn any_difference_in_content_changes_the_hash() {
        let base = r#"{"action_ref":"core.echo","parameters":{"message":"hi","tags":["a","b"]}}"#;
        let others = [
            r#"{"action_ref":"core.echo","parameters":{"message":"hi ","tags":["a","b"]}}"#,
            r#"{"action_ref":"core.echo","parameters":{"message":"hi","tags":["b","a"]}}"#,
            r#"{"action_ref":"core.echo","parameters":{"message":"hi","tags":["a","b"],"x":null}}"#,
            r#"{"action_ref":"core.echo","parameters":{"message":"hi","tags":"a,b"}}"#,
            r#"{"action_ref":"core.other","parameters":{"message":"hi","tags":["a","b"]}}"#,
            r#"{"action_ref":"core.echo","parameters":{"messag":"ehi","tags":["a","b"]}}"#,
        ];
        for other in others {
            assert_ne!(request_sha256(&parsed(base)), request_sha256(&parsed(other)), "{other}");
        }
    }

    #[test]
    fn strings_are_escaped_so_no_two_structures_print_alike() {
        // a key that contains what would otherwise look like a separator
        let a = parsed(r#"{"a\":\"b":"c"}"#);
        let b = parsed(r#"{"a":"b\":\"c"}"#);
        assert_ne!(request_sha256(&a), request_sha256(&b));
        let mut text = String::new();
        canonical_json(&parsed(r#"{ "b" : [1, 2.5, true, null], "a" : "\u00e9\n" }"#), &mut text);
        assert_eq!(text, r#"{"a":"é\n","b":[1,2.5,true,null]}"#);
    }
}
