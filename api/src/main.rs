//! attune-api: the HTTP API.

use clap::Parser;

/// The attune HTTP API. Settings come from the environment: ATTUNE_API_ADDR (0.0.0.0:8080),
/// DATABASE_URL, AMQP_URL, ATTUNE_MQ_NAMESPACE, ATTUNE_DEFAULT_TIMEOUT_SECS, ATTUNE_HEALTH_*.
#[derive(Parser)]
#[command(version)]
struct Args {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Args::parse();
    attune_common::telemetry::init();
    let settings = attune_api::Settings::from_env()?;
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    attune_api::run(settings, shutdown).await?;
    Ok(())
}
