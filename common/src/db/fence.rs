//! The executors' pulse and the key of their fence notices (`crate::fence`).

use sqlx::PgPool;

/// Writes the pulse (a committed write: a stall of commits fails it as an outage does) and
/// returns the key notices are signed with.
pub async fn pulse(db: &PgPool) -> Result<Vec<u8>, sqlx::Error> {
    // (the clock when the row is written, not when the transaction began: a pulse that waited for
    // another's lock sees the gap the wait made)
    let key: String = sqlx::query_scalar(
        "UPDATE fence SET writable_since = CASE WHEN pulsed_at IS NULL OR writable_since IS NULL \
                 OR clock_timestamp() - pulsed_at > interval '5 s' THEN clock_timestamp() ELSE writable_since END, \
             pulsed_at = clock_timestamp() RETURNING key",
    )
    .fetch_one(db)
    .await?;
    Ok(key.into_bytes())
}

/// The key a worker checks notices with.
pub async fn key(db: &PgPool) -> Result<Vec<u8>, sqlx::Error> {
    let key: String = sqlx::query_scalar("SELECT key FROM fence").fetch_one(db).await?;
    Ok(key.into_bytes())
}
