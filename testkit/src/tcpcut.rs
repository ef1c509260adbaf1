//! A TCP proxy that can be partitioned: while it is, nothing passes either way and every
//! connection stays open (a partition, not a reset); when it heals, what it held passes on, as
//! TCP would retransmit it. For any protocol (the broker's, say); `pgcut` also reads
//! PostgreSQL's framing.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct TcpCut {
    pub port: u16,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

impl TcpCut {
    /// Listens on a free local port, forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> TcpCut {
        TcpCut::start_on("127.0.0.1:0", upstream).await
    }

    /// Listens on `listen` (`address:port`), forwarding to `upstream`.
    pub async fn start_on(listen: &str, upstream: &str) -> TcpCut {
        let listener = TcpListener::bind(listen).await.unwrap_or_else(|e| panic!("cannot listen on {listen}: {e}"));
        let addr = listener.local_addr().unwrap();
        let port = addr.port();
        let open = Arc::new(tokio::sync::watch::Sender::new(true));
        let (upstream, gate) = (upstream.to_string(), open.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, gate) = (upstream.clone(), gate.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::select! {
                            _ = pass(client_read, server_write, &gate) => {}
                            _ = pass(server_read, client_write, &gate) => {}
                        }
                    }
                });
            }
        });
        TcpCut { port, addr, open }
    }

    /// `url` with its host and port replaced by this proxy's.
    pub fn url(&self, url: &str) -> String {
        with_authority(url, &self.addr.to_string())
    }

    /// From now on nothing passes either way.
    pub fn partition(&self) {
        self.open.send_replace(false);
    }

    /// What the partition held passes on, and everything after it.
    pub fn heal(&self) {
        self.open.send_replace(true);
    }
}

/// `url` with its host and port replaced by `host_port`.
pub fn with_authority(url: &str, host_port: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, path) = rest.split_once('/').map_or((rest, String::new()), |(a, p)| (a, format!("/{p}")));
    let credentials = authority.rsplit_once('@').map(|(c, _)| format!("{c}@")).unwrap_or_default();
    format!("{scheme}://{credentials}{host_port}{path}")
}

/// Copies `from` to `to`, each chunk once the gate is open.
async fn pass(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    gate: &tokio::sync::watch::Sender<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let mut open = gate.subscribe();
        let _ = open.wait_for(|open| *open).await;
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
