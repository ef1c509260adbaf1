//! Settings shared by every service, read from the environment through the one table of
//! settings (`crate::settings`): its defaults are the defaults in force.

use std::path::PathBuf;

use attune_core::health::HealthThresholds;
use attune_core::retry::RetrySettings;

pub use crate::settings::{Defaults, Environment, Source, parse, read, read_optional};

#[derive(Debug, thiserror::Error)]
#[error("invalid value {value:?} for {name}: {reason}")]
pub struct ConfigError {
    pub name: String,
    pub value: String,
    pub reason: String,
}

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

/// Settings read from a `Source`: the environment in the services, a map or nothing in tests.
pub trait FromEnv: Sized {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError>;

    fn from_env() -> Result<Self, ConfigError> {
        Self::from_source(&Environment)
    }
}

impl FromEnv for CommonSettings {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        Ok(CommonSettings {
            database_url: read(source, "DATABASE_URL")?,
            amqp_url: read(source, "AMQP_URL")?,
            mq_namespace: read(source, "ATTUNE_MQ_NAMESPACE")?,
            packs_dir: read(source, "ATTUNE_PACKS_DIR")?,
            default_timeout_secs: read(source, "ATTUNE_DEFAULT_TIMEOUT_SECS")?,
        })
    }
}

/// The older name of `ATTUNE_HEARTBEAT_MAX_AGE_SECS`, read when only it is set.
const OLDER_MAX_AGE: &str = "ATTUNE_HEALTH_HEARTBEAT_MAX_AGE_SECS";

impl FromEnv for HealthThresholds {
    /// `ATTUNE_HEALTH_<FIELD>`, and `ATTUNE_HEARTBEAT_MAX_AGE_SECS` (or its older name
    /// `ATTUNE_HEALTH_HEARTBEAT_MAX_AGE_SECS`).
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        let max_age =
            match (read_optional(source, OLDER_MAX_AGE), read_optional(source, "ATTUNE_HEARTBEAT_MAX_AGE_SECS")) {
                (Some(older), None) => parse(OLDER_MAX_AGE, &older)?,
                _ => read(source, "ATTUNE_HEARTBEAT_MAX_AGE_SECS")?,
            };
        Ok(HealthThresholds {
            enabled: read(source, "ATTUNE_HEALTH_ENABLED")?,
            heartbeat_max_age_secs: max_age,
            degraded_threshold: read(source, "ATTUNE_HEALTH_DEGRADED_THRESHOLD")?,
            unhealthy_threshold: read(source, "ATTUNE_HEALTH_UNHEALTHY_THRESHOLD")?,
            queue_depth_degraded: read(source, "ATTUNE_HEALTH_QUEUE_DEPTH_DEGRADED")?,
            queue_depth_unhealthy: read(source, "ATTUNE_HEALTH_QUEUE_DEPTH_UNHEALTHY")?,
            failure_rate_degraded: read(source, "ATTUNE_HEALTH_FAILURE_RATE_DEGRADED")?,
            failure_rate_unhealthy: read(source, "ATTUNE_HEALTH_FAILURE_RATE_UNHEALTHY")?,
            failure_rate_min_executions: read(source, "ATTUNE_HEALTH_FAILURE_RATE_MIN_EXECUTIONS")?,
        })
    }
}

impl FromEnv for RetrySettings {
    /// `ATTUNE_RETRY_<FIELD>`, checked together.
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        let config = RetrySettings {
            enabled: read(source, "ATTUNE_RETRY_ENABLED")?,
            base_backoff_secs: read(source, "ATTUNE_RETRY_BASE_BACKOFF_SECS")?,
            max_backoff_secs: read(source, "ATTUNE_RETRY_MAX_BACKOFF_SECS")?,
            backoff_multiplier: read(source, "ATTUNE_RETRY_BACKOFF_MULTIPLIER")?,
            jitter_factor: read(source, "ATTUNE_RETRY_JITTER_FACTOR")?,
            circuit: match read_optional(source, "ATTUNE_CIRCUIT_FAILURE_RATE") {
                None => None,
                Some(rate) => Some(attune_core::pack::CircuitSpec {
                    failure_rate: parse("ATTUNE_CIRCUIT_FAILURE_RATE", &rate)?,
                    window_secs: read(source, "ATTUNE_CIRCUIT_WINDOW_SECS")?,
                    min_executions: read(source, "ATTUNE_CIRCUIT_MIN_EXECUTIONS")?,
                    open_secs: read(source, "ATTUNE_CIRCUIT_OPEN_SECS")?,
                }),
            },
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
    use crate::settings::Vars;

    #[test]
    fn the_table_s_defaults_are_the_core_s_defaults() {
        assert_eq!(HealthThresholds::from_source(&Defaults).unwrap(), HealthThresholds::default());
        assert_eq!(RetrySettings::from_source(&Defaults).unwrap(), RetrySettings::default());
        let common = CommonSettings::from_source(&Defaults).unwrap();
        assert_eq!((common.mq_namespace.as_str(), common.default_timeout_secs), ("attune", 300));
    }

    #[test]
    fn the_older_heartbeat_name_still_works_and_garbage_is_named() {
        let older = Vars(&[("ATTUNE_HEALTH_HEARTBEAT_MAX_AGE_SECS", "12")]);
        assert_eq!(HealthThresholds::from_source(&older).unwrap().heartbeat_max_age_secs, 12);
        let both = Vars(&[("ATTUNE_HEALTH_HEARTBEAT_MAX_AGE_SECS", "12"), ("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "20")]);
        assert_eq!(HealthThresholds::from_source(&both).unwrap().heartbeat_max_age_secs, 20);
        let error = RetrySettings::from_source(&Vars(&[("ATTUNE_RETRY_JITTER_FACTOR", "2")])).unwrap_err();
        assert_eq!(error.name, "ATTUNE_RETRY_JITTER_FACTOR");
        let error = CommonSettings::from_source(&Vars(&[("ATTUNE_DEFAULT_TIMEOUT_SECS", "soon")])).unwrap_err();
        assert!(error.to_string().starts_with("invalid value \"soon\" for ATTUNE_DEFAULT_TIMEOUT_SECS"), "{error}");
    }
}
