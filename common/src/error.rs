//! The error of a service's run: the api, the executor and the workers fail in the same few
//! ways (the database, its migrations, the broker, a setting, a listener), so they share one enum;
//! each crate names it `Error` (`executor::Error`).

use crate::config::ConfigError;
use crate::db;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{0}")]
    SchemaBehind(#[from] db::SchemaBehind),
    #[error("broker: {0}")]
    Broker(#[from] crate::mq::MqError),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl db::AsTransient for ServiceError {
    /// The database or the broker being away passes; the rest does not.
    fn is_transient(&self) -> bool {
        match self {
            ServiceError::Database(e) => db::is_transient(e),
            ServiceError::Broker(_) => true,
            ServiceError::Migrate(_)
            | ServiceError::SchemaBehind(_)
            | ServiceError::Io(_)
            | ServiceError::Config(_) => false,
        }
    }
}
