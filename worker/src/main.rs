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

fn main() -> anyhow::Result<()> {
    // `attune-worker supervise ...`: this process supervises one action (see `supervise`)
    attune_worker::supervise::run_if_asked();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
    let args: Args = attune_common::settings::parse_with_settings_help(attune_common::settings::Process::Worker);
    let _telemetry = attune_common::telemetry::init("attune-worker");
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
    // each action runs under this very binary in supervisor mode, so it dies with the worker
    // (the image it runs, whatever became of its file since)
    settings.supervisor = Some(attune_worker::supervise::OWN_BINARY.into());
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    attune_worker::run(settings, shutdown).await?;
    Ok(())
}
