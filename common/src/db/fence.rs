//! The executors' pulse and the key of their fence notices (`crate::fence`).

use sqlx::PgPool;

/// Writes the pulse (a committed write: a stall of commits fails it as an outage does) and
/// returns the key notices are signed with.
pub async fn pulse(db: &PgPool) -> Result<Vec<u8>, sqlx::Error> {
    let key: String = sqlx::query_scalar("UPDATE fence SET pulsed_at = now() RETURNING key").fetch_one(db).await?;
    Ok(key.into_bytes())
}

/// The key a worker checks notices with.
pub async fn key(db: &PgPool) -> Result<Vec<u8>, sqlx::Error> {
    let key: String = sqlx::query_scalar("SELECT key FROM fence").fetch_one(db).await?;
    Ok(key.into_bytes())
}
