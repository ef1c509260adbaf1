//! attune-api: the HTTP API.

use clap::Parser;

/// The attune HTTP API. Its settings (from the environment) are listed after the options.
#[derive(Parser)]
#[command(version)]
struct Args {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _: Args = attune_common::settings::parse_with_settings_help(attune_common::settings::Process::Api);
    let _telemetry = attune_common::telemetry::init("attune-api");
    let settings = attune_api::Settings::from_env()?;
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    attune_api::run(settings, shutdown).await?;
    Ok(())
}
