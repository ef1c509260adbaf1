//! attune-common: the adapters every service shares around `attune-core`'s decisions:
//! configuration from the environment, the PostgreSQL repositories (`db`, the only SQL layer),
//! the RabbitMQ topology (`mq`), pack loading from disk, metrics and logging.

pub mod batch;
pub mod config;
pub mod db;
pub mod error;
pub mod fence;
pub mod metrics;
pub mod mq;
pub mod pack;
pub mod schedule;
pub mod secrets;
pub mod settings;
pub mod telemetry;
pub mod tls;
pub mod trace;

pub use error::ServiceError;
