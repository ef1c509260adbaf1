//! attune-worker: runs actions dispatched to it.

use clap::Parser;

/// Runs the actions dispatched to it, records their successes and reports their failures.
///
/// Settings come from the environment (flags override):
///   DATABASE_URL, AMQP_URL, ATTUNE_MQ_NAMESPACE, ATTUNE_PACKS_DIR,
///   ATTUNE_WORKER_NAME, ATTUNE_WORKER_RUNTIMES (shell,python,builtin), ATTUNE_WORKER_CONCURRENCY (4),
///   ATTUNE_HEARTBEAT_INTERVAL_SECS (10), ATTUNE_HEARTBEAT_MAX_AGE_SECS (30),
///   ATTUNE_WORKER_QUEUE_TTL_SECS (300), ATTUNE_WORKER_DRAIN_SECS (30),
///   ATTUNE_WORKER_OUTPUT_LIMIT_BYTES (65536), ATTUNE_DEFAULT_TIMEOUT_SECS (300),
///   ATTUNE_PYTHON (interpreter; default: python3 resolved once at start), ATTUNE_HEALTH_*,
///   ATTUNE_WORKER_HEALTH_OVERRIDE_FILE (JSON whose fields replace the reported health counters).
#[derive(Parser)]
#[command(version, verbatim_doc_comment)]
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
    let args = Args::parse();
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
