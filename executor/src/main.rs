//! attune-executor: schedules executions onto workers and records their results.

use clap::Parser;

/// Schedules executions onto workers and records their results. Settings come from the
/// environment: DATABASE_URL, AMQP_URL, ATTUNE_MQ_NAMESPACE, ATTUNE_EXECUTOR_PREFETCH,
/// ATTUNE_WORKER_QUEUE_TTL_SECS, ATTUNE_DEFAULT_TIMEOUT_SECS, ATTUNE_HEARTBEAT_MAX_AGE_SECS and
/// ATTUNE_HEALTH_* (see README).
#[derive(Parser)]
#[command(version)]
struct Args {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Args::parse();
    attune_common::telemetry::init();
    let settings = attune_executor::Settings::from_env()?;
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    attune_executor::run(settings, shutdown).await?;
    Ok(())
}
