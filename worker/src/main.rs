//! attune-worker: runs actions dispatched to it.

use clap::Parser;

/// Runs the actions dispatched to it, records their successes and reports their failures.
/// Its settings (from the environment; the flags below win) are listed after the options.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Worker name, unique among workers (ATTUNE_WORKER_NAME)
    #[arg(long)]
    name: Option<String>,
    /// Runtimes to offer, comma separated (ATTUNE_WORKER_RUNTIMES)
    #[arg(long)]
    runtimes: Option<String>,
    /// Actions run at once (ATTUNE_WORKER_CONCURRENCY)
    #[arg(long)]
    concurrency: Option<u16>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Args = attune_common::settings::parse_with_settings_help(attune_common::settings::Process::Worker);
    attune_common::telemetry::init();
    let mut settings = attune_worker::Settings::from_env()?;
    if let Some(name) = args.name {
        settings.name = name;
    }
    if let Some(runtimes) = args.runtimes {
        settings.runtimes = runtimes.split(',').map(|r| r.trim().to_string()).collect();
    }
    if let Some(concurrency) = args.concurrency {
        settings.concurrency = concurrency;
    }
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    attune_worker::run(settings, shutdown).await?;
    Ok(())
}
