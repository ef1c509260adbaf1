//! attune-common: the domain types and pure decision functions every service shares, plus the
//! adapters around them (configuration, PostgreSQL repositories, RabbitMQ topology).
//!
//! The decision modules (`status`, `failure`, `health`, `selection`, `params`, `pack` parsing)
//! do no I/O: they take plain data and the time, and return a decision.

pub mod config;
pub mod db;
pub mod error;
pub mod failure;
pub mod health;
pub mod metrics;
pub mod mq;
pub mod pack;
pub mod params;
pub mod retry;
pub mod selection;
pub mod status;
pub mod telemetry;

pub use error::ServiceError;
pub use failure::FailureKind;
pub use status::ExecutionStatus;
