//! Logging and tracing set-up for the binaries: `RUST_LOG` filters, `ATTUNE_LOG_FORMAT=json` for
//! JSON lines, and, when an OTLP endpoint is configured, OpenTelemetry traces of each execution
//! (`crate::trace`) exported over OTLP/HTTP.

use tracing_subscriber::EnvFilter;

/// Keeps the trace exporter of a service: dropped at the end of `main`, it sends the spans still
/// buffered (at most `OTEL_BSP_EXPORT_TIMEOUT`, 30 s by default).
#[must_use = "dropping it at once stops the traces"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("attune: the last spans were not all sent: {e}");
        }
    }
}

/// Starts logging, and traces if `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set,
/// as `service` (unless `OTEL_SERVICE_NAME` names it); installs ring as the process's TLS provider
/// (`crate::tls`): every service calls this first and keeps what it returns until it ends.
pub fn init(service: &str) -> Telemetry {
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
    let endpoint = read_optional(&Environment, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| read_optional(&Environment, "OTEL_EXPORTER_OTLP_ENDPOINT"));
    let named = read_optional(&Environment, "OTEL_SERVICE_NAME").is_some();
    let provider = endpoint.and_then(|endpoint| match exporter() {
        Ok(exporter) => {
            let resource = opentelemetry_sdk::Resource::builder();
            let resource = if named { resource } else { resource.with_service_name(service.to_string()) };
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource.build())
                .build();
            tracing::info!(endpoint = %shown(&endpoint), "traces go to the OTLP endpoint");
            Some(provider)
        }
        Err(e) => {
            tracing::warn!(endpoint = %shown(&endpoint), error = %e, "no traces: the OTLP exporter could not be made");
            None
        }
    });
    if let Some(provider) = &provider {
        use opentelemetry::trace::TracerProvider;
        crate::trace::turn_on(provider.tracer("attune"));
    }
    Telemetry { provider }
}

/// An endpoint as logs show it: without the user and password a URL may carry.
fn shown(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@').filter(|(userinfo, _)| !userinfo.contains('/')) {
            Some((_, host)) => format!("{scheme}://{host}"),
            None => endpoint.to_string(),
        },
        None => endpoint.to_string(),
    }
}

#[cfg(test)]
#[test]
fn a_logged_endpoint_shows_no_credentials() {
    assert_eq!(shown("https://user:secret@collector:4318/x"), "https://collector:4318/x");
    assert_eq!(shown("http://127.0.0.1:4318"), "http://127.0.0.1:4318");
    assert_eq!(shown("http://collector:4318/a@b"), "http://collector:4318/a@b");
}

fn exporter() -> Result<opentelemetry_otlp::SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry_otlp::WithExportConfig;
    // (the endpoint, headers and timeout from the OTEL_EXPORTER_OTLP_* variables)
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
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
