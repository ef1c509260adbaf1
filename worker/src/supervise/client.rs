//! The worker's side of its long-lived supervisor (`supervise::server`): starts it (again, after
//! it is lost), sends it each process action to start with the action's pipes, and routes what it
//! reports (started, could not start, exited) to the run that waits for it.
//!
//! When the supervisor dies (its socket closes), the worker SIGKILLs the process groups of the
//! runs it knows, ends those runs as the platform's loss (`worker_unavailable`, retried), and the
//! next run starts a new supervisor. A start not answered within `ANSWER_PATIENCE` is given up
//! alone (the same loss) when the supervisor still answers a `PING` (one exec stuck on a stalled
//! file system holds only its own starter); a supervisor that does not answer is killed.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::protocol::{self, SpawnRequest};

/// A worker's long-lived supervisor, started at once and again whenever it was lost.
pub struct Supervisor {
    program: PathBuf,
    current: Mutex<Option<Arc<Connection>>>,
    next_id: AtomicU64,
    /// The worker's lease deadline, sent to each supervisor (`protocol::LEASE`).
    lease: Mutex<Option<u128>>,
}

/// One supervisor process and the runs it has.
struct Connection {
    socket: AsyncFd<OwnedFd>,
    pid: u32,
    runs: Mutex<HashMap<u64, Waiting>>,
    lost: AtomicBool,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
    /// `PING`s sent and not answered, by id.
    pings: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<()>>>,
}

/// A run the worker asked for and has not seen end.
struct Waiting {
    /// Its process (and group) once started.
    pid: Option<i32>,
    events: mpsc::UnboundedSender<Event>,
}

#[derive(Debug)]
enum Event {
    Started(i32),
    NotStarted { errno: i32, message: String },
    Exited(i32),
    Lost,
}

/// Why an action was not started through the supervisor.
#[derive(Debug)]
pub enum SpawnError {
    /// No supervisor could be started or reached (the error says why).
    Unavailable(io::Error),
    /// The supervisor could not start the program (`errno`, as the kernel said it).
    NotStarted { errno: i32, message: String },
    /// The supervisor was lost before it said whether the run started.
    Lost,
    /// The supervisor goes on, but did not say within `ANSWER_PATIENCE` whether the run started
    /// (its start waits, on a stalled file system): given up, and killed if it ever starts.
    Stuck,
}

/// How a supervised run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Its wait status (its group was killed before it was reaped).
    Exited(i32),
    /// Its supervisor was lost; the worker SIGKILLed its group.
    Lost,
}

/// A running action.
pub struct SupervisedRun {
    connection: Arc<Connection>,
    id: u64,
    pid: i32,
    events: mpsc::UnboundedReceiver<Event>,
    ended: Option<Ended>,
}

impl Supervisor {
    /// A supervisor that runs `program` (the worker's own binary) in supervisor mode; it is
    /// started at once (a failure is logged, and tried again at the first run).
    pub fn start(program: PathBuf) -> Supervisor {
        let supervisor =
            Supervisor { program, current: Mutex::new(None), next_id: AtomicU64::new(1), lease: Mutex::new(None) };
        if let Err(e) = supervisor.connection() {
            tracing::warn!(error = %e, "could not start the action supervisor; trying again at the first run");
        }
        supervisor
    }

    /// The supervisor process's id, while one runs.
    pub fn pid(&self) -> Option<u32> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().filter(|c| !c.lost.load(Ordering::SeqCst)).map(|c| c.pid)
    }

    /// The running supervisor, started if there is none (or the last one was lost).
    fn connection(&self) -> io::Result<Arc<Connection>> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(connection) = current.as_ref().filter(|c| !c.lost.load(Ordering::SeqCst)) {
            return Ok(connection.clone());
        }
        let connection = Connection::start(&self.program)?;
        // a new supervisor learns the lease before its first run
        if let Some(deadline) = *self.lease.lock().unwrap_or_else(|e| e.into_inner()) {
            connection.send_lease(deadline);
        }
        *current = Some(connection.clone());
        Ok(connection)
    }

    /// The worker's lease now runs out at `deadline` (boot clock): the supervisor is told at
    /// once, and a new one when it starts. Nothing on disk can make this fail (ADR 0008's file
    /// is for the per-action fallback supervisors).
    pub fn send_lease(&self, deadline: u128) {
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(connection) = current.as_ref().filter(|c| !c.lost.load(Ordering::SeqCst)) {
            connection.send_lease(deadline);
        }
    }

    /// Starts `request` with its stdin, stdout and stderr (the child's ends, closed here once
    /// sent); returns once the supervisor said whether it started.
    pub async fn spawn(&self, request: &SpawnRequest, stdio: [OwnedFd; 3]) -> Result<SupervisedRun, SpawnError> {
        let connection = self.connection().map_err(SpawnError::Unavailable)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, mut events) = mpsc::unbounded_channel();
        connection.runs.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Waiting { pid: None, events: sender });
        if connection.lost.load(Ordering::SeqCst) {
            connection.forget(id);
            return Err(SpawnError::Lost);
        }
        // if this future is dropped before the run is handed over, what was started is killed
        let mut pending = Pending { connection: connection.clone(), id, armed: true };
        let encoded = request.encode();
        let mut parts = encoded.chunks(protocol::PART_BODY).peekable();
        let mut sent = Ok(());
        while let Some(part) = parts.next() {
            let last = parts.peek().is_none();
            let (kind, fds) = if last {
                (protocol::SPAWN, stdio.iter().map(AsRawFd::as_raw_fd).collect::<Vec<_>>())
            } else {
                (protocol::SPAWN_PART, Vec::new())
            };
            sent = connection.send(&protocol::message(kind, id, part), &fds).await;
            if sent.is_err() {
                break;
            }
        }
        drop(stdio);
        if let Err(e) = sent {
            connection.forget(id);
            return Err(SpawnError::Unavailable(e));
        }
        // a start not answered past `ANSWER_PATIENCE` is given up: alone (its request is killed
        // as `pending` is dropped) if the supervisor still answers, so that one exec stuck on a
        // stalled file system costs one run; else the supervisor (stopped, or lost) would hold
        // every run slot, and it is killed, its runs end as its loss does, and the next run
        // starts a new one
        let first = match tokio::time::timeout(ANSWER_PATIENCE, events.recv()).await {
            Ok(first) => first,
            Err(_) if connection.answers(self.next_id.fetch_add(1, Ordering::Relaxed)).await => match events.try_recv()
            {
                // (its answer came while the ping was answered: the supervisor reads in order)
                Ok(first) => Some(first),
                Err(_) => {
                    tracing::error!(
                        supervisor_pid = connection.pid,
                        patience_ms = ANSWER_PATIENCE.as_millis() as u64,
                        program = %request.program.to_string_lossy(),
                        cwd = %request.cwd.to_string_lossy(),
                        "an action's start did not finish (its exec or directory waits: a stalled file system?): \
                         the run is given up, the supervisor serves the others"
                    );
                    return Err(SpawnError::Stuck);
                }
            },
            Err(_) => {
                tracing::error!(
                    supervisor_pid = connection.pid,
                    patience_ms = ANSWER_PATIENCE.as_millis() as u64,
                    "the action supervisor did not answer a start: killing it (a new one serves the next run)"
                );
                connection.kill_process();
                return Err(SpawnError::Lost);
            }
        };
        pending.armed = false;
        match first {
            Some(Event::Started(pid)) => Ok(SupervisedRun { connection, id, pid, events, ended: None }),
            Some(Event::NotStarted { errno, message }) => Err(SpawnError::NotStarted { errno, message }),
            Some(Event::Exited(_)) | Some(Event::Lost) | None => Err(SpawnError::Lost),
        }
    }
}

/// A spawn request sent and not answered yet.
struct Pending {
    connection: Arc<Connection>,
    id: u64,
    armed: bool,
}

impl Drop for Pending {
    /// The supervisor reads in order: a kill after the request kills the run it started (and
    /// one after a part of it forgets the parts).
    fn drop(&mut self) {
        if self.armed {
            let message = protocol::message(protocol::KILL, self.id, &libc::SIGKILL.to_le_bytes());
            if let Err(e) = protocol::send(self.connection.socket.as_raw_fd(), &message, &[])
                && e.kind() == io::ErrorKind::WouldBlock
            {
                // (no group is known yet: if the send cannot wait, the supervisor's loss or the
                // worker's end is what takes the run down)
                send_later(&self.connection, message, 0, libc::SIGKILL);
            }
            self.connection.forget(self.id);
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // its reader holds the socket: without it the supervisor sees the socket close, kills
        // what still runs and exits
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(connection) = current
            && let Some(reader) = connection.reader.lock().unwrap_or_else(|e| e.into_inner()).take()
        {
            reader.abort();
        }
    }
}

/// How long the worker waits for the supervisor to say whether a run started: a clone and an exec,
/// milliseconds when all is well.
const ANSWER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the worker waits for a `PONG`: the supervisor's loop answers between two looks, in
/// well under a millisecond when all is well.
const PING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

impl Connection {
    /// SIGKILLs the supervisor process (its reader then sees the socket close and ends its runs
    /// as lost). The worker has not reaped it, so the id is still its. It is taken for lost at
    /// once: a run that starts before the reader has seen the close goes to a new supervisor, not
    /// to this one's dead socket (and from there to the per-action fallback, leaving the worker
    /// without its supervisor until the next run).
    #[allow(unsafe_code)]
    fn kill_process(&self) {
        self.lost.store(true, Ordering::SeqCst);
        // SAFETY: kill(2) on the id of a child of this process that it has not waited for.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
        }
    }

    /// Starts a supervisor process: `<program> supervisor <worker pid> <socket fd>`, in a process
    /// group of its own (a terminal's Ctrl-C is the worker's to handle).
    #[allow(unsafe_code)]
    fn start(program: &Path) -> io::Result<Arc<Connection>> {
        let (ours, theirs) = protocol::socketpair()?;
        let theirs_fd = theirs.as_raw_fd();
        let mut command = std::process::Command::new(program);
        if let Some(name) = super::shown_name(program) {
            std::os::unix::process::CommandExt::arg0(&mut command, name);
        }
        command
            .arg(super::server::MODE)
            .arg(std::process::id().to_string())
            .arg(theirs_fd.to_string())
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only clears the
        // close-on-exec flag of the supervisor's end of the socket (fcntl is async-signal-safe),
        // so that it is the one descriptor the supervisor inherits besides stdio.
        unsafe {
            command.pre_exec(move || {
                if libc::fcntl(theirs_fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        drop(theirs);
        // SAFETY: fcntl sets a flag on the worker's end of the socket, owned here.
        unsafe {
            let flags = libc::fcntl(ours.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(ours.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        // SAFETY: an OwnedFd gives the same open descriptor for as long as it lives, and the
        // AsyncFd owns it.
        let socket = match unsafe { AsyncFd::register(ours) } {
            Ok(socket) => socket,
            Err(e) => {
                let (_, e) = e.into_parts();
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let connection = Arc::new(Connection {
            socket,
            pid: child.id(),
            runs: Mutex::new(HashMap::new()),
            lost: AtomicBool::new(false),
            reader: Mutex::new(None),
            pings: Mutex::new(HashMap::new()),
        });
        tracing::info!(pid = child.id(), "action supervisor started");
        let reader = tokio::spawn(connection.clone().read(child));
        *connection.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(reader.abort_handle());
        Ok(connection)
    }

    /// Routes what the supervisor reports until it is gone, then ends its runs.
    async fn read(self: Arc<Self>, mut process: std::process::Child) {
        let mut buffer = vec![0u8; protocol::MAX_MESSAGE];
        loop {
            let Ok(mut guard) = self.socket.readable().await else { break };
            let received = match guard.try_io(|socket| protocol::receive(socket, &mut buffer)) {
                Ok(Ok(Some((n, _fds)))) => n,
                Ok(Ok(None)) => break,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(_)) => break,
                Err(_would_block) => continue,
            };
            let Some((kind, id, body)) = protocol::parse(&buffer[..received]) else { continue };
            if kind == protocol::PONG {
                if let Some(answered) = self.pings.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
                    let _ = answered.send(());
                }
                continue;
            }
            let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
            match kind {
                protocol::STARTED => {
                    if let (Some(waiting), Some(pid)) = (runs.get_mut(&id), protocol::int_of(body)) {
                        waiting.pid = Some(pid);
                        let _ = waiting.events.send(Event::Started(pid));
                    }
                }
                protocol::NOT_STARTED => {
                    if let (Some(waiting), Some(errno)) = (runs.remove(&id), protocol::int_of(body)) {
                        let message = String::from_utf8_lossy(&body[4..]).into_owned();
                        let _ = waiting.events.send(Event::NotStarted { errno, message });
                    }
                }
                protocol::EXITED => {
                    if let (Some(waiting), Some(status)) = (runs.remove(&id), protocol::int_of(body)) {
                        let _ = waiting.events.send(Event::Exited(status));
                    }
                }
                _ => {}
            }
        }
        self.lost.store(true, Ordering::SeqCst);
        let runs: Vec<Waiting> = self.runs.lock().unwrap_or_else(|e| e.into_inner()).drain().map(|(_, w)| w).collect();
        for waiting in &runs {
            if let Some(pid) = waiting.pid {
                signal_group(pid, libc::SIGKILL);
            }
            let _ = waiting.events.send(Event::Lost);
        }
        tracing::error!(pid = self.pid, runs = runs.len(), "the action supervisor was lost; its runs were killed");
        let _ = tokio::task::spawn_blocking(move || process.wait()).await;
    }

    /// Sends a lease deadline now (a socket too full to take it, which holds spawn requests in
    /// flight, is left to the next renewal, a second away at most).
    fn send_lease(&self, deadline: u128) {
        let message = protocol::message(protocol::LEASE, 0, &deadline.to_le_bytes());
        if let Err(e) = protocol::send(self.socket.get_ref().as_raw_fd(), &message, &[]) {
            tracing::debug!(error = %e, "could not send the lease to the action supervisor now");
        }
    }

    /// Sends one message, waiting while the socket is full.
    async fn send(&self, message: &[u8], fds: &[i32]) -> io::Result<()> {
        loop {
            let mut guard = self.socket.writable().await?;
            match guard.try_io(|socket| protocol::send(socket.as_raw_fd(), message, fds)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Whether the supervisor answers a `PING` (id `id`) within `PING_PATIENCE`.
    async fn answers(&self, id: u64) -> bool {
        let (answered, answer) = tokio::sync::oneshot::channel();
        self.pings.lock().unwrap_or_else(|e| e.into_inner()).insert(id, answered);
        let ping = protocol::message(protocol::PING, id, &[]);
        let asked = async { self.send(&ping, &[]).await.is_ok() && answer.await.is_ok() };
        let answers = tokio::time::timeout(PING_PATIENCE, asked).await.unwrap_or(false);
        self.pings.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        answers
    }

    fn forget(&self, id: u64) {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }
}

impl SupervisedRun {
    /// The action's process, the leader of its process group.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the run to end (cancel-safe).
    pub async fn wait(&mut self) -> Ended {
        if let Some(ended) = self.ended {
            return ended;
        }
        let ended = loop {
            match self.events.recv().await {
                Some(Event::Exited(status)) => break Ended::Exited(status),
                Some(Event::Lost) | None => break Ended::Lost,
                Some(_) => continue,
            }
        };
        self.ended = Some(ended);
        ended
    }

    /// Signals the run's whole process group, through the supervisor (which knows whether the
    /// group is still the run's), or directly when the supervisor cannot be reached.
    pub fn signal(&self, signal: i32) {
        if self.ended.is_some() {
            return;
        }
        let message = protocol::message(protocol::KILL, self.id, &signal.to_le_bytes());
        if self.connection.lost.load(Ordering::SeqCst) {
            signal_group(self.pid, signal);
            return;
        }
        match protocol::send(self.connection.socket.as_raw_fd(), &message, &[]) {
            Ok(()) => {}
            // the socket is full (a start of several MB in flight): the request waits its turn,
            // through the supervisor still, which alone knows whether the group is still the
            // run's (it may have reaped it, and its id be another's by now)
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => send_later(&self.connection, message, self.pid, signal),
            Err(_) => signal_group(self.pid, signal),
        }
    }
}

impl Drop for SupervisedRun {
    /// A run dropped mid-way (its task aborted) takes its whole group with it.
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// Sends `message` once the socket takes it, on a task of its own (from a `Drop`, which cannot
/// wait). Outside a runtime, or if the supervisor is lost meanwhile, signals `pgid`'s group
/// directly instead (0: none known).
fn send_later(connection: &Arc<Connection>, message: Vec<u8>, pgid: i32, signal: i32) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        if pgid > 0 {
            signal_group(pgid, signal);
        }
        return;
    };
    let connection = connection.clone();
    runtime.spawn(async move {
        if connection.send(&message, &[]).await.is_err() && pgid > 0 {
            signal_group(pgid, signal);
        }
    });
}

#[allow(unsafe_code)]
fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group; it has no memory-safety
    // preconditions. The group is a run's (its supervisor made it for that run alone).
    unsafe {
        libc::kill(-pgid, signal);
    }
}
