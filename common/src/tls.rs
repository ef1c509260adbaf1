//! TLS for attune's clients: one stack, rustls with the `ring` provider, for the API's clients
//! (reqwest), PostgreSQL (sqlx) and RabbitMQ (lapin). Nothing links aws-lc-rs, OpenSSL or
//! native-tls.
//!
//! What each connection trusts:
//! - PostgreSQL: the URL's `sslmode` and `sslrootcert`, as libpq reads them: `prefer` (the
//!   default: encrypted when the server offers it, the certificate not checked), `require`
//!   (encrypted, not checked), `verify-ca` (signed by `sslrootcert` or a system root),
//!   `verify-full` (that, and issued to the URL's host name).
//! - RabbitMQ: an `amqps://` URL is verified (chain and host name) against the system's roots
//!   plus the PEM file in `ATTUNE_AMQP_CA_CERT`.
//! - The API (the CLI): an `https://` URL is verified against the system's roots plus the PEM
//!   file in `ATTUNE_CA_CERT`.
//!
//! reqwest is built without a provider of its own and takes the process's default: every
//! process installs ring as that default before it builds a client ([`install_default_provider`],
//! called by `telemetry::init`, `db::connect`, `mq::connect` and the CLI's client), and a
//! `reqwest::Client` built before any of them panics saying so.

use std::path::Path;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::config::ConfigError;

/// Makes ring the process's default rustls provider, unless one is installed already (then
/// this does nothing: every provider this workspace can install is ring).
pub fn install_default_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // losing a race to another thread installing it is fine
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The certificates of the PEM file `path`, named by the setting `setting` (a private CA to
/// trust besides the system's roots), as PEM text. The error names the setting and the file: a
/// file that cannot be read, or holds no certificate, or one that does not parse.
pub fn read_ca_file(setting: &str, path: &Path) -> Result<String, ConfigError> {
    let error = |reason: String| ConfigError { name: setting.to_string(), value: path.display().to_string(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| error(format!("cannot read the CA file: {e}")))?;
    let certificates = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(format!("not a PEM certificate file: {e}")))?;
    if certificates.is_empty() {
        return Err(error("the file holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    Ok(text)
}

/// The CA file named by the setting `setting` in `source`, read by [`read_ca_file`]; `None`
/// when the setting is unset.
pub fn ca_from(source: &dyn crate::settings::Source, setting: &str) -> Result<Option<String>, ConfigError> {
    match crate::settings::read_optional(source, setting) {
        Some(path) => read_ca_file(setting, Path::new(path.trim())).map(Some),
        None => Ok(None),
    }
}

/// The TLS error (a refused certificate, a failed handshake) in `error` or its sources, if any.
/// rustls errors travel inside `io::Error`s (sometimes one inside another), whose `source()`
/// skips what they wrap: each is opened too.
pub fn tls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = match current.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let missing = read_ca_file("ATTUNE_CA_CERT", Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert_eq!((missing.name.as_str(), missing.value.as_str()), ("ATTUNE_CA_CERT", "/nonexistent/ca.pem"));
        assert!(missing.reason.contains("cannot read the CA file"), "{missing}");

        let empty = std::env::temp_dir().join(format!("attune-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = read_ca_file("ATTUNE_AMQP_CA_CERT", &empty).unwrap_err();
        std::fs::remove_file(&empty).unwrap();
        assert!(error.reason.contains("holds no PEM certificate"), "{error}");
    }

    #[test]
    fn installing_the_provider_twice_is_harmless() {
        install_default_provider();
        install_default_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
