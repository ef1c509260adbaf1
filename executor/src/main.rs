//! attune-executor: schedules executions onto workers and records their results.

use clap::Parser;

/// Schedules executions onto workers and records their results. Its settings (from the
/// environment) are listed after the options.
#[derive(Parser)]
#[command(version)]
struct Args {}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _: Args = attune_common::settings::parse_with_settings_help(attune_common::settings::Process::Executor);
    let _telemetry = attune_common::telemetry::init("attune-executor");
    let settings = attune_executor::Settings::from_env()?;
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    attune_executor::run(settings, shutdown).await?;
    Ok(())
}
