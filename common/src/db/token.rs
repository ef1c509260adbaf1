//! API tokens: random, shown once, stored as a SHA-256 hash.
//!
//! Tokens carry 256 random bits, so a fast hash is enough (nothing to brute-force); a slow
//! password hash per request would cap the API at a few hundred requests per second.

use rand::RngExt;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

pub const PREFIX: &str = "attune_";

pub fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

fn generate() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let body: String = (0..43).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("{PREFIX}{body}")
}

/// Creates a token called `name` and returns it; only its hash is stored.
pub async fn create(db: &PgPool, name: &str) -> Result<String, sqlx::Error> {
    let token = generate();
    sqlx::query("INSERT INTO api_token (name, token_hash) VALUES ($1, $2)")
        .bind(name)
        .bind(hash(&token))
        .execute(db)
        .await?;
    Ok(token)
}

/// The id of the live token matching `token`, if any.
pub async fn verify(db: &PgPool, token: &str) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM api_token WHERE token_hash = $1 AND revoked IS NULL")
        .bind(hash(token))
        .fetch_optional(db)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_prefixed() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 43);
        assert_eq!(hash(&a).len(), 32);
        assert_ne!(hash(&a), hash(&b));
    }
}
