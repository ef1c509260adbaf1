//! Logging set-up for the binaries: `RUST_LOG` filters, `ATTUNE_LOG_FORMAT=json` for JSON lines.

use tracing_subscriber::EnvFilter;

/// Starts logging, and installs ring as the process's TLS provider (`crate::tls`): every service
/// calls this first.
pub fn init() {
    crate::tls::install_default_provider();
    use crate::settings::{Defaults, Environment, read, read_optional};
    let default: String = read(&Defaults, "RUST_LOG").expect("RUST_LOG's default");
    let given: String = read(&Environment, "RUST_LOG").unwrap_or_else(|_| default.clone());
    let filter = EnvFilter::try_new(&given).unwrap_or_else(|_| EnvFilter::new(&default));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if read_optional(&Environment, "ATTUNE_LOG_FORMAT").is_some_and(|f| f.trim() == "json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// A token cancelled on SIGINT or SIGTERM: every service runs until it fires.
pub fn shutdown_on_signal() -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("failed to install SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        tracing::info!("shutdown requested");
        fire.cancel();
    });
    token
}
