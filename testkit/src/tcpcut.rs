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
    /// The bytes that doom the connection they are sent on (`lose_answer_to`), until they have.
    trap: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
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
        let trap: Arc<std::sync::Mutex<Option<Vec<u8>>>> = Arc::default();
        let (upstream, gate, armed) = (upstream.to_string(), open.clone(), trap.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, gate, armed) = (upstream.clone(), gate.clone(), armed.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        let doomed = std::sync::atomic::AtomicBool::new(false);
                        tokio::select! {
                            _ = pass(client_read, server_write, &gate, Some((&armed, &doomed)), None) => {}
                            _ = pass(server_read, client_write, &gate, None, Some(&doomed)) => {}
                        }
                    }
                });
            }
        });
        TcpCut { port, addr, open, trap }
    }

    /// The next connection that sends `bytes` (a request line, say) gets no answer: what the
    /// server answers is dropped and the connection closed. The server did receive it: for the
    /// client, a request that may or may not have been carried out.
    pub fn lose_answer_to(&self, bytes: &[u8]) {
        *self.trap.lock().unwrap() = Some(bytes.to_vec());
    }

    /// Whether the trap of `lose_answer_to` has sprung.
    pub fn answer_lost(&self) -> bool {
        self.trap.lock().unwrap().is_none()
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

/// What a connection's client sent that dooms it (`TcpCut::lose_answer_to`), and whether it has.
type Trap<'a> = (&'a std::sync::Mutex<Option<Vec<u8>>>, &'a std::sync::atomic::AtomicBool);

/// Copies `from` to `to`, each chunk once the gate is open; a chunk holding the trap's bytes
/// dooms the connection, and a copy told to `stop` on a doomed one ends there (the connection
/// closed, nothing more written).
async fn pass(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    gate: &tokio::sync::watch::Sender<bool>,
    trap: Option<Trap<'_>>,
    stop: Option<&std::sync::atomic::AtomicBool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if stop.is_some_and(|doomed| doomed.load(std::sync::atomic::Ordering::SeqCst)) {
            return;
        }
        if let Some((armed, doomed)) = trap {
            let mut armed = armed.lock().unwrap();
            if armed.as_ref().is_some_and(|bytes| buffer[..read].windows(bytes.len()).any(|w| w == bytes.as_slice())) {
                *armed = None;
                doomed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let mut open = gate.subscribe();
        let _ = open.wait_for(|open| *open).await;
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
