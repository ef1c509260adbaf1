//! A TCP proxy in front of PostgreSQL that loses one acknowledgement on purpose: once armed with
//! a piece of SQL, the first statement containing it runs (and commits) on the server, and the
//! connection is cut before its answer reaches the client. The client sees an I/O error for a
//! write that landed: a lost commit acknowledgement.
//!
//! It can also go silent: the server's answers stop reaching the clients, whose connections stay
//! open; or silence only the connection a given statement is sent on, once the statement has
//! gone to the server (a half-open connection: its host cut off, a NAT that forgot it). Or be partitioned: nothing passes either way (new connections included) until it heals,
//! when everything held passes on, as TCP would retransmit it.
//!
//! It reads the protocol's framing (a type byte and a length) in both directions; connect through
//! it with `sslmode=disable` (an SSL request would not be framed that way).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Trap {
    /// The SQL that springs the trap, until it has.
    armed: Option<String>,
    sprung: usize,
    /// Nothing more reaches the clients, and their connections stay open: a connection dropped
    /// without a reset (a firewall or NAT that forgot it, a partition).
    silent: bool,
    /// The SQL whose connection goes silent once the statement has gone to the server, until
    /// one has.
    silencing: Option<String>,
    /// How many connections went silent so.
    silenced: usize,
}

pub struct PgCut {
    pub port: u16,
    trap: Arc<Mutex<Trap>>,
    /// Whether messages pass (false while partitioned).
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

impl PgCut {
    /// Listens on a free local port, forwarding to the PostgreSQL of `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> PgCut {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let trap: Arc<Mutex<Trap>> = Arc::default();
        let open = Arc::new(tokio::sync::watch::Sender::new(true));
        let upstream = upstream.to_string();
        let (shared, gate) = (trap.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, trap, gate) = (upstream.clone(), shared.clone(), gate.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, trap, gate).await;
                    }
                });
            }
        });
        PgCut { port, trap, open }
    }

    /// `url` (a `postgres://` URL) pointed at this proxy, without SSL.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let credentials = authority.rsplit_once('@').map(|(c, _)| format!("{c}@")).unwrap_or_default();
        let separator = if path.contains('?') { '&' } else { '?' };
        format!("{scheme}://{credentials}127.0.0.1:{}/{path}{separator}sslmode=disable", self.port)
    }

    /// The next statement whose text contains `sql` runs, and its answer is lost.
    pub fn arm(&self, sql: &str) {
        self.trap.lock().unwrap().armed = Some(sql.to_string());
    }

    /// From now on the server's answers are dropped, and every connection stays open.
    pub fn go_silent(&self) {
        self.trap.lock().unwrap().silent = true;
    }

    /// The next statement whose text contains `sql` goes to the server (and runs there), and
    /// from then on nothing passes either way on its connection, which stays open: a half-open
    /// connection. Other connections, and new ones, pass. (A prepared statement shows its text
    /// only the first time a connection prepares it.)
    pub fn silence_on(&self, sql: &str) {
        self.trap.lock().unwrap().silencing = Some(sql.to_string());
    }

    /// How many connections `silence_on` silenced so far.
    pub fn silenced(&self) -> usize {
        self.trap.lock().unwrap().silenced
    }

    /// From now on nothing passes either way, and every connection stays open.
    pub fn partition(&self) {
        self.open.send_replace(false);
    }

    /// What the partition held passes on, and everything after it.
    pub fn heal(&self) {
        self.open.send_replace(true);
    }

    /// How many answers were lost so far.
    pub fn sprung(&self) -> usize {
        self.trap.lock().unwrap().sprung
    }
}

/// Reads one framed message (type byte, length including itself, body); `typed: false` for the
/// startup message, which has no type byte.
async fn message(reader: &mut (impl AsyncRead + Unpin), typed: bool) -> Option<Vec<u8>> {
    let mut head = vec![0u8; if typed { 5 } else { 4 }];
    reader.read_exact(&mut head).await.ok()?;
    let at = head.len() - 4;
    let length = u32::from_be_bytes(head[at..].try_into().unwrap()) as usize;
    let mut body = vec![0u8; length.checked_sub(4)?];
    reader.read_exact(&mut body).await.ok()?;
    head.extend_from_slice(&body);
    Some(head)
}

/// Waits until messages pass (see `PgCut::partition`).
async fn passing(gate: &tokio::sync::watch::Sender<bool>) {
    let mut open = gate.subscribe();
    let _ = open.wait_for(|open| *open).await;
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    trap: Arc<Mutex<Trap>>,
    gate: Arc<tokio::sync::watch::Sender<bool>>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Every Sync and every simple Query gets exactly one ReadyForQuery: `doomed` is the number of
    // the one that answers the trapped statement (0: none). Its answer, and everything the
    // server sends after the ReadyForQuery before it, is never relayed.
    let doomed = Arc::new(AtomicUsize::new(0));
    // this connection went silent (`PgCut::silence_on`)
    let silenced = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let upward = {
        let (trap, doomed, gate, silenced) = (trap.clone(), doomed.clone(), gate.clone(), silenced.clone());
        async move {
            // the startup ends with a ReadyForQuery of its own
            let (mut typed, mut marked, mut syncs) = (false, false, 1usize);
            // the silencing statement was parsed here; executed, to be silenced at its Sync
            let (mut silence_marked, mut silence_at_sync) = (false, false);
            while let Some(message) = message(&mut client_read, typed).await {
                if silenced.load(SeqCst) {
                    continue;
                }
                if typed {
                    let text = String::from_utf8_lossy(&message[5..]);
                    let mut trap = trap.lock().unwrap();
                    let silencing = trap.silencing.as_deref().is_some_and(|sql| text.contains(sql));
                    match message[0] {
                        b'Q' if silencing => {
                            trap.silencing = None;
                            trap.silenced += 1;
                            silenced.store(true, SeqCst);
                        }
                        b'P' if silencing => {
                            trap.silencing = None;
                            silence_marked = true;
                        }
                        b'E' if silence_marked => silence_at_sync = true,
                        b'S' if silence_at_sync => {
                            trap.silenced += 1;
                            silenced.store(true, SeqCst);
                        }
                        _ => {}
                    }
                    let hit = trap.armed.as_deref().is_some_and(|sql| text.contains(sql));
                    match message[0] {
                        b'S' | b'Q' => syncs += 1,
                        _ => {}
                    }
                    match message[0] {
                        // a simple query runs at once; a prepared one at its Execute, answered
                        // by the next Sync
                        b'Q' if hit => {
                            trap.armed = None;
                            doomed.store(syncs, SeqCst);
                        }
                        b'P' if hit => {
                            trap.armed = None;
                            marked = true;
                        }
                        b'E' if marked => {
                            marked = false;
                            doomed.store(syncs + 1, SeqCst);
                        }
                        _ => {}
                    }
                }
                typed = true;
                passing(&gate).await;
                if server_write.write_all(&message).await.is_err() {
                    break;
                }
            }
        }
    };
    let downward = async move {
        let mut ready = 0usize;
        while let Some(message) = message(&mut server_read, true).await {
            if trap.lock().unwrap().silent || silenced.load(SeqCst) {
                continue;
            }
            let target = doomed.load(SeqCst);
            if message[0] == b'Z' {
                ready += 1;
                if target != 0 && ready == target {
                    // the trapped statement has committed: its answer is lost with the connection
                    trap.lock().unwrap().sprung += 1;
                    return;
                }
            } else if target != 0 && ready + 1 == target {
                continue;
            }
            passing(&gate).await;
            if client_write.write_all(&message).await.is_err() {
                break;
            }
        }
    };
    // whichever side ends first ends the connection (both halves are dropped)
    tokio::select! {
        _ = upward => {}
        _ = downward => {}
    }
}
