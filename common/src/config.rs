//! Settings shared by every service, read from the environment.

use std::path::PathBuf;
use std::str::FromStr;

use attune_core::health::HealthProbeConfig;
use attune_core::retry::RetryConfig;

#[derive(Debug, thiserror::Error)]
#[error("invalid value {value:?} for {name}: {reason}")]
pub struct ConfigError {
    pub name: String,
    pub value: String,
    pub reason: String,
}

/// Reads `name` from the environment and parses it, or returns `default` when it is unset or empty.
pub fn env_or<T: FromStr>(name: &str, default: T) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value.trim().parse().map_err(|e: T::Err| ConfigError {
            name: name.to_string(),
            value,
            reason: e.to_string(),
        }),
        _ => Ok(default),
    }
}

pub const DEFAULT_DATABASE_URL: &str = "postgres://attune:attune@127.0.0.1:5432/attune";
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[derive(Debug, Clone)]
pub struct CommonSettings {
    pub database_url: String,
    pub amqp_url: String,
    /// Prefix of every exchange and queue name (`ATTUNE_MQ_NAMESPACE`, default `attune`), so that
    /// several installations (or test runs) can share one broker without seeing each other.
    pub mq_namespace: String,
    pub packs_dir: PathBuf,
    /// The action timeout when an action declares none (`ATTUNE_DEFAULT_TIMEOUT_SECS`, 300 s).
    pub default_timeout_secs: i32,
}

impl CommonSettings {
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(CommonSettings {
            database_url: env_or("DATABASE_URL", DEFAULT_DATABASE_URL.to_string())?,
            amqp_url: env_or("AMQP_URL", DEFAULT_AMQP_URL.to_string())?,
            mq_namespace: env_or("ATTUNE_MQ_NAMESPACE", "attune".to_string())?,
            packs_dir: env_or("ATTUNE_PACKS_DIR", PathBuf::from("./packs"))?,
            default_timeout_secs: env_or("ATTUNE_DEFAULT_TIMEOUT_SECS", 300)?,
        })
    }
}

/// Settings of `attune-core` types read from the environment (the core crate reads nothing).
pub trait FromEnv: Sized {
    fn from_env() -> Result<Self, ConfigError>;
}

impl FromEnv for HealthProbeConfig {
    /// Reads `ATTUNE_HEALTH_<FIELD>` (and `ATTUNE_HEARTBEAT_MAX_AGE_SECS`) over the defaults.
    fn from_env() -> Result<Self, ConfigError> {
        let d = Self::default();
        Ok(HealthProbeConfig {
            enabled: env_or("ATTUNE_HEALTH_ENABLED", d.enabled)?,
            heartbeat_max_age_secs: env_or(
                "ATTUNE_HEARTBEAT_MAX_AGE_SECS",
                env_or("ATTUNE_HEALTH_HEARTBEAT_MAX_AGE_SECS", d.heartbeat_max_age_secs)?,
            )?,
            degraded_threshold: env_or("ATTUNE_HEALTH_DEGRADED_THRESHOLD", d.degraded_threshold)?,
            unhealthy_threshold: env_or("ATTUNE_HEALTH_UNHEALTHY_THRESHOLD", d.unhealthy_threshold)?,
            queue_depth_degraded: env_or("ATTUNE_HEALTH_QUEUE_DEPTH_DEGRADED", d.queue_depth_degraded)?,
            queue_depth_unhealthy: env_or("ATTUNE_HEALTH_QUEUE_DEPTH_UNHEALTHY", d.queue_depth_unhealthy)?,
            failure_rate_degraded: env_or("ATTUNE_HEALTH_FAILURE_RATE_DEGRADED", d.failure_rate_degraded)?,
            failure_rate_unhealthy: env_or("ATTUNE_HEALTH_FAILURE_RATE_UNHEALTHY", d.failure_rate_unhealthy)?,
            failure_rate_min_executions: env_or(
                "ATTUNE_HEALTH_FAILURE_RATE_MIN_EXECUTIONS",
                d.failure_rate_min_executions,
            )?,
        })
    }
}

impl FromEnv for RetryConfig {
    /// Reads `ATTUNE_RETRY_<FIELD>` over the defaults and checks the result.
    fn from_env() -> Result<Self, ConfigError> {
        let d = Self::default();
        let config = RetryConfig {
            enabled: env_or("ATTUNE_RETRY_ENABLED", d.enabled)?,
            base_backoff_secs: env_or("ATTUNE_RETRY_BASE_BACKOFF_SECS", d.base_backoff_secs)?,
            max_backoff_secs: env_or("ATTUNE_RETRY_MAX_BACKOFF_SECS", d.max_backoff_secs)?,
            backoff_multiplier: env_or("ATTUNE_RETRY_BACKOFF_MULTIPLIER", d.backoff_multiplier)?,
            jitter_factor: env_or("ATTUNE_RETRY_JITTER_FACTOR", d.jitter_factor)?,
        };
        config.validate().map_err(|e| ConfigError {
            name: e.name.to_string(),
            value: e.value,
            reason: e.reason.to_string(),
        })?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_gives_default_and_garbage_names_the_variable() {
        assert_eq!(env_or("ATTUNE_TEST_SURELY_UNSET", 7u32).unwrap(), 7);
        // PATH is always set and is not a number
        let err = env_or("PATH", 1u32).unwrap_err();
        assert_eq!(err.name, "PATH");
        assert!(err.to_string().starts_with("invalid value"));
    }
}
