//! TLS for tests: a CA and a server certificate made with `openssl` for one test, and a
//! TLS-terminating TCP proxy that serves that certificate in front of a plain port. RabbitMQ and
//! the API speak plain TCP here: through the proxy, clients are tested over `amqps://` and
//! `https://` with a certificate they must verify.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The `openssl` configuration: the CA's extensions and the server's (`localhost` and
/// `127.0.0.1`, as rustls wants them: a subjectAltName, serverAuth, not a CA).
const OPENSSL_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = attune test CA
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// A CA of its own and a server certificate it signed, in a directory removed on drop.
pub struct TestCertificates {
    pub dir: PathBuf,
    /// The CA's certificate (PEM): what a client must trust.
    pub ca: PathBuf,
    /// The server's certificate (PEM), for `localhost` and `127.0.0.1`, valid two days.
    pub server_cert: PathBuf,
    /// The server's private key (PEM, PKCS#8).
    pub server_key: PathBuf,
}

impl TestCertificates {
    /// Makes the CA and the server certificate (P-256 keys) in a new temporary directory.
    /// Panics, saying what failed, when `openssl` is missing or refuses.
    pub fn make() -> TestCertificates {
        let dir = std::env::temp_dir().join(format!("attune-tls-{}-{:x}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("openssl.cnf"), OPENSSL_CONFIG).unwrap();
        let certificates = TestCertificates {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            dir,
        };
        let p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        certificates.openssl(
            &[
                &["req", "-x509", "-config", "openssl.cnf", "-extensions", "ca"][..],
                &p256,
                &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"],
            ]
            .concat(),
        );
        certificates.openssl(
            &[
                &["req", "-new", "-config", "openssl.cnf", "-subj", "/CN=localhost"][..],
                &p256,
                &["-keyout", "server.key", "-out", "server.csr"],
            ]
            .concat(),
        );
        let serial = format!("{}", rand::random::<u32>());
        certificates.openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial,
            "-days",
            "2",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            "server",
            "-out",
            "server.pem",
        ]);
        certificates
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run openssl (needed to make test certificates): {e}"));
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The CA's certificate as PEM text.
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(&self.ca).unwrap()
    }

    fn server_config(&self) -> rustls::ServerConfig {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(&self.server_cert).unwrap().collect::<Result<_, _>>().unwrap();
        let key = PrivateKeyDer::from_pem_file(&self.server_key).unwrap();
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the server certificate and key match")
    }
}

impl Drop for TestCertificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS-terminating TCP proxy on `127.0.0.1`: it completes a TLS handshake with each client
/// (serving the test certificate), then forwards bytes both ways to a plain upstream port. It
/// counts handshakes that completed and those that failed (a client that refused the
/// certificate). Dropping it closes the listener and every forwarded connection.
pub struct TlsProxy {
    pub port: u16,
    handshakes: Arc<AtomicUsize>,
    failed_handshakes: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

/// PostgreSQL's `SSLRequest`: length 8, code 80877103. A client sends it in plain text before
/// its TLS handshake, and the server answers `S` when it will speak TLS.
const POSTGRES_SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

impl TlsProxy {
    /// A proxy whose clients start TLS at once (`https://`, `amqps://`).
    pub async fn start(certificates: &TestCertificates, upstream: SocketAddr) -> TlsProxy {
        Self::start_with(certificates, upstream, false).await
    }

    /// A proxy in front of PostgreSQL: it answers the client's `SSLRequest` itself, then
    /// terminates TLS and forwards the rest (the startup message on) in plain text, as a server
    /// with the test certificate would.
    pub async fn start_postgres(certificates: &TestCertificates, upstream: SocketAddr) -> TlsProxy {
        Self::start_with(certificates, upstream, true).await
    }

    async fn start_with(certificates: &TestCertificates, upstream: SocketAddr, postgres: bool) -> TlsProxy {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(certificates.server_config()));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the TLS proxy");
        let port = listener.local_addr().unwrap().port();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let failed_handshakes = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn({
            let (handshakes, failed_handshakes) = (handshakes.clone(), failed_handshakes.clone());
            async move {
                // owned by this task: aborting it (on drop) ends every connection too
                let mut connections = JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    while connections.try_join_next().is_some() {}
                    let (acceptor, handshakes, failed_handshakes) =
                        (acceptor.clone(), handshakes.clone(), failed_handshakes.clone());
                    connections.spawn(async move {
                        let mut client = client;
                        if postgres && !answered_ssl_request(&mut client).await {
                            return;
                        }
                        let mut client = match acceptor.accept(client).await {
                            Ok(client) => client,
                            Err(_) => {
                                failed_handshakes.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                        };
                        handshakes.fetch_add(1, Ordering::SeqCst);
                        if let Ok(mut server) = TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                }
            }
        });
        TlsProxy { port, handshakes, failed_handshakes, accept }
    }

    /// Handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// Handshakes that failed so far (the client refused the certificate, or hung up).
    pub fn failed_handshakes(&self) -> usize {
        self.failed_handshakes.load(Ordering::SeqCst)
    }
}

/// Reads a PostgreSQL client's `SSLRequest` and answers that TLS follows; `false` (the client
/// is dropped) for anything else.
async fn answered_ssl_request(client: &mut TcpStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut request = [0u8; 8];
    client.read_exact(&mut request).await.is_ok()
        && request == POSTGRES_SSL_REQUEST
        && client.write_all(b"S").await.is_ok()
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The address of `url`'s host and port (`http://127.0.0.1:8080`, `amqp://u:p@host:5672/v`),
/// resolved: where a proxy forwards to.
pub fn upstream_of(url: &str, default_port: u16) -> SocketAddr {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme.split(['/', '?']).next().unwrap();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let with_port = if host_port.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok()) {
        host_port.to_string()
    } else {
        format!("{host_port}:{default_port}")
    };
    std::net::ToSocketAddrs::to_socket_addrs(&with_port)
        .unwrap_or_else(|e| panic!("cannot resolve {with_port} (from {url}): {e}"))
        .next()
        .unwrap()
}
