//! PostgreSQL repositories. Every SQL statement of the services lives under this module, always
//! with bound parameters.

pub mod action;
pub mod execution;
pub mod pack;
pub mod token;
pub mod worker;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Connects (retrying with backoff until `deadline` passes, so that a service started alongside
/// its database waits for it) and returns a pool.
pub async fn connect(database_url: &str, max_connections: u32, deadline: Duration) -> Result<PgPool, sqlx::Error> {
    let started = std::time::Instant::now();
    let mut delay = Duration::from_millis(100);
    loop {
        let attempt = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect(database_url)
            .await;
        match attempt {
            Ok(pool) => return Ok(pool),
            Err(e) if started.elapsed() < deadline => {
                tracing::warn!(error = %e, "database not reachable yet, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Applies pending migrations. Safe to call from several services at once (sqlx takes an
/// advisory lock).
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}
