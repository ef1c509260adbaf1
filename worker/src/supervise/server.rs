//! The long-lived supervisor of a worker (`attune-worker supervisor <worker pid> <socket fd>`):
//! one single-threaded process per worker that starts every process action (`spawn`), holds
//! each one's process group to its limits and the worker's lease, and takes every group down
//! when the worker dies. See the `supervise` module's comment for the whole design; the
//! messages are in `protocol`.
//!
//! The loop waits in `poll` on the worker's socket, a `signalfd` (SIGCHLD, and SIGUSR1 as the
//! parent-death signal) and its starters' `eventfd` (`starters`: the threads that make each start
//! off the loop, so that an exec stuck on a stalled file system holds up no other run), with a
//! timeout that is the next thing due: a run's next look at its group, or the lease's deadline.
//! With no run it waits for the worker alone, and costs nothing.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::protocol::{self, SpawnRequest};
use super::starters::{self, Starters};
use super::{Enforced, Group, LEASE_EXPIRED, LimitKind, LimitReport, boot_clock_ns, exceeded, read_lease, rlimits};

/// The first argument that starts the worker's binary as its long-lived supervisor.
pub const MODE: &str = "supervisor";

/// How often a young run's group is looked at (its memory and CPU time).
const FIRST_LOOKS: Duration = Duration::from_millis(50);
/// For how long a run is looked at every `FIRST_LOOKS`.
const YOUNG: Duration = Duration::from_secs(2);
/// The longest time between two looks at a run that has run long (a twentieth of its age up to
/// this): its memory and CPU time change slowly, and the rlimit backstops hold meanwhile.
const LATEST_LOOKS: Duration = Duration::from_secs(1);
/// How often a lease that has run out is read again while runs it killed are still ending.
const LEASE_RECHECK: Duration = Duration::from_millis(100);

/// When a run that has run for `age` is looked at next, after a look now.
pub(super) fn look_interval(age: Duration) -> Duration {
    if age < YOUNG { FIRST_LOOKS } else { (age / 20).clamp(FIRST_LOOKS, LATEST_LOOKS) }
}

/// Whether a run looked at next at `next_look`, `age` old, is looked at by a walk `now`.
fn due(next_look: Instant, age: Duration, now: Instant) -> bool {
    next_look <= now + look_interval(age) / 2
}

/// One running action.
struct Run {
    id: u64,
    /// The action's process, the leader of its group (pgid = pid).
    pid: i32,
    /// The action's stderr, where the limit report and the lease line are written.
    stderr: std::fs::File,
    enforced: Enforced,
    started: Instant,
    next_look: Instant,
    /// The group at its last look.
    cpu_secs: f64,
    /// Killed already (for a limit or the lease): not killed nor reported again.
    killed: bool,
}

struct Supervisor {
    worker: i32,
    socket: OwnedFd,
    runs: Vec<Run>,
    /// Spawn requests being received, by run id.
    partial: HashMap<u64, Vec<u8>>,
    /// Messages to the worker not sent yet (its socket was full: a frozen worker does not stop
    /// the supervisor from enforcing the lease).
    outbox: VecDeque<Vec<u8>>,
    lease_file: Option<OsString>,
    /// The last deadline read from the lease file, or sent by the worker.
    lease: Option<u128>,
    /// The worker sends its deadlines (`protocol::LEASE`): the file is not read.
    lease_sent: bool,
    starters: Starters,
    /// Starts handed to the starters, by run id: what the run is held to once started.
    starting: HashMap<u64, Starting>,
    /// Children reaped before their start's outcome came (pid → wait status): a child can end
    /// before its starter has handed its pid over. Each is claimed by that outcome. (A pid taken
    /// again by another start in that moment of microseconds would need the kernel to go round
    /// every pid first.)
    unclaimed: HashMap<i32, i32>,
    /// Children that failed before their exec and are not reaped yet: reaped without a report.
    discard: std::collections::HashSet<i32>,
}

/// A start in a starter's hands.
struct Starting {
    enforced: Enforced,
    stderr: std::fs::File,
    /// A signal the worker asked for meanwhile (a start it gave up on), or the lease's end:
    /// sent to the group once it starts.
    signal: Option<i32>,
    /// The child's pid once its starter has made it (0 before): a start that waits (on a
    /// stalled file system) is killed with it where the kernel lets it die.
    pid: std::sync::Arc<std::sync::atomic::AtomicI32>,
    /// Told to its starter: a SIGKILL asked for before it was started leaves it unstarted.
    cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Runs the supervisor; returns its exit code (it exits only when its worker is gone, or when
/// it cannot start).
#[allow(unsafe_code)]
pub fn serve(args: &[OsString]) -> i32 {
    let parse = |arg: Option<&OsString>| arg.and_then(|a| a.to_str()).and_then(|a| a.parse::<i32>().ok());
    let (Some(worker), Some(socket)) = (parse(args.first()), parse(args.get(1))) else {
        eprintln!("attune-worker {MODE}: usage: attune-worker {MODE} <worker pid> <socket fd>");
        return 2;
    };
    // Not dumpable, as the worker is not (`lifecycle::protect_process`): the requests it holds
    // carry parameters and secrets, and a run as another user shares its memory until its exec
    // (`spawn`).
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) only changes a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        eprintln!("attune-worker {MODE}: cannot start: {}", std::io::Error::last_os_error());
        return 2;
    }
    // From here no process of this user may attach. A tracer left attached since the exec (strace
    // or gdb following the worker's children) is refused: the requests carry secrets. (A hostile
    // process of this user attaching in that moment could defeat this check; what keeps one out
    // is running actions as users of their own, or Yama's ptrace_scope of 1 or more.)
    match tracer() {
        Ok(None) => {}
        Ok(Some(tracer)) => {
            eprintln!("attune-worker {MODE}: cannot start: traced by process {tracer}");
            return 2;
        }
        Err(e) => {
            eprintln!("attune-worker {MODE}: cannot start: cannot read /proc/self/status: {e}");
            return 2;
        }
    }
    let set = super::watch_signals();
    // SAFETY: signalfd returns a new descriptor owned once below; fcntl sets a flag on the
    // socket descriptor the worker passed at this number, which this process owns from here on.
    let (signals, socket) = unsafe {
        let signals = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if signals < 0 || libc::fcntl(socket, libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
            eprintln!("attune-worker {MODE}: cannot start: {}", std::io::Error::last_os_error());
            return 2;
        }
        (OwnedFd::from_raw_fd(signals), OwnedFd::from_raw_fd(socket))
    };
    if !parent_alive(worker) {
        // the worker died before the signal was asked for
        return 0;
    }
    let starters = match Starters::new() {
        Ok(starters) => starters,
        Err(e) => {
            eprintln!("attune-worker {MODE}: cannot start: {e}");
            return 2;
        }
    };
    let mut supervisor = Supervisor {
        worker,
        socket,
        runs: Vec::new(),
        partial: HashMap::new(),
        outbox: VecDeque::new(),
        lease_file: None,
        lease: None,
        lease_sent: false,
        starters,
        starting: HashMap::new(),
        unclaimed: HashMap::new(),
        discard: std::collections::HashSet::new(),
    };
    let mut buffer = vec![0u8; protocol::MAX_MESSAGE];
    loop {
        let timeout = supervisor.next_due(Instant::now());
        let mut fds = [
            libc::pollfd {
                fd: supervisor.socket.as_raw_fd(),
                events: libc::POLLIN | if supervisor.outbox.is_empty() { 0 } else { libc::POLLOUT },
                revents: 0,
            },
            libc::pollfd { fd: signals.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: supervisor.starters.wake_fd(), events: libc::POLLIN, revents: 0 },
        ];
        let millis = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: poll reads and writes the local array of three pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 3, millis) };
        if fds[1].revents != 0 && supervisor.signals(&signals) {
            supervisor.kill_all_and_exit();
        }
        supervisor.reap();
        if fds[2].revents != 0 {
            supervisor.started();
        }
        if fds[0].revents & libc::POLLIN != 0 && !supervisor.receive(&mut buffer) {
            supervisor.kill_all_and_exit();
        }
        if fds[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 && fds[0].revents & libc::POLLIN == 0 {
            supervisor.kill_all_and_exit();
        }
        let now = Instant::now();
        supervisor.check_lease();
        supervisor.look(now);
        if !supervisor.flush() {
            supervisor.kill_all_and_exit();
        }
    }
}

impl Supervisor {
    /// How long the loop may wait: until the next look or the lease's deadline; forever with no
    /// run.
    fn next_due(&self, now: Instant) -> Option<Duration> {
        let look = self.runs.iter().filter(|run| !run.killed && run.enforced.looks()).map(|run| run.next_look).min();
        let mut due = look.map(|at| at.saturating_duration_since(now));
        // (a start in a starter's hands is held to the lease too)
        if !(self.runs.is_empty() && self.starting.is_empty()) && (self.lease_file.is_some() || self.lease_sent) {
            let lease = match self.lease {
                Some(deadline) => {
                    let left = deadline.saturating_sub(boot_clock_ns());
                    if left == 0 { LEASE_RECHECK } else { Duration::from_nanos(left.min(u64::MAX as u128) as u64) }
                }
                None => LEASE_RECHECK,
            };
            due = Some(due.map_or(lease, |d| d.min(lease)));
        }
        // (a millisecond more, so that a deadline is past when the loop wakes for it)
        due.map(|d| (d + Duration::from_millis(1)).min(LATEST_LOOKS))
    }

    /// Reads the signals that came; true when the worker is gone.
    #[allow(unsafe_code)]
    fn signals(&self, signals: &OwnedFd) -> bool {
        let mut worker_gone = false;
        loop {
            // SAFETY: reads one signalfd_siginfo into a local struct of its size.
            let (n, info) = unsafe {
                let mut info: libc::signalfd_siginfo = std::mem::zeroed();
                let n = libc::read(
                    signals.as_raw_fd(),
                    &mut info as *mut _ as *mut libc::c_void,
                    std::mem::size_of::<libc::signalfd_siginfo>(),
                );
                (n, info)
            };
            if n <= 0 {
                break;
            }
            // the parent-death signal is tied to the worker's thread that started this process:
            // a thread that ended sends it too, so the parent is checked
            if info.ssi_signo == libc::SIGUSR1 as u32 && !parent_alive(self.worker) {
                worker_gone = true;
            }
            // SIGTERM and the like are the worker's to act on (they do not reach the actions,
            // which are in groups of their own)
        }
        worker_gone
    }

    /// Reaps every action that ended: its group is killed while the leader is a zombie (its pid
    /// and so its group id cannot be taken by another process meanwhile), then it is reaped and
    /// reported.
    #[allow(unsafe_code)]
    fn reap(&mut self) {
        loop {
            // SAFETY: waitid with WNOWAIT only reads the state of this process's children into a
            // local struct; kill signals a group this process made (the zombie's); waitpid reaps
            // that child; the status is local.
            let (pid, status) = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                if libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) != 0 {
                    break;
                }
                let pid = info.si_pid();
                if pid <= 0 {
                    break;
                }
                libc::kill(-pid, libc::SIGKILL);
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
                (pid, status)
            };
            let Some(index) = self.runs.iter().position(|run| run.pid == pid) else {
                // a child whose start's outcome has not come yet, or one that failed before its
                // exec (no report: its start answers for it)
                if !self.discard.remove(&pid) {
                    self.unclaimed.insert(pid, status);
                }
                continue;
            };
            let run = self.runs.swap_remove(index);
            self.exited(run, status);
        }
    }

    /// Reports a run whose process ended with `status` (reaped, its group killed).
    fn exited(&mut self, mut run: Run, status: i32) {
        if libc::WIFSIGNALED(status)
            && libc::WTERMSIG(status) == libc::SIGXCPU
            && let Some(secs) = run.enforced.cpu_secs
            && !run.killed
        {
            // the kernel's backstop stopped it before a look did
            let used = run.cpu_secs.max(secs as f64);
            report(&mut run.stderr, &LimitReport { limit: LimitKind::CpuSecs, value: secs, used });
        }
        self.outbox.push_back(protocol::message(protocol::EXITED, run.id, &status.to_le_bytes()));
        // (its stderr closes here: the worker's reader ends once the killed group's are gone)
    }

    /// Takes the outcomes of the starts the starters made: a run started is held to its limits
    /// and the lease from here (and reported at once if it has ended already); one that could
    /// not start is answered so.
    fn started(&mut self) {
        for starters::Outcome { id, child, started } in self.starters.take() {
            let Some(starting) = self.starting.remove(&id) else { continue };
            match started {
                Ok(pid) => {
                    let now = Instant::now();
                    let run = Run {
                        id,
                        pid,
                        stderr: starting.stderr,
                        enforced: starting.enforced,
                        started: now,
                        next_look: now + FIRST_LOOKS,
                        cpu_secs: 0.0,
                        // (killed already, by the lease's end, if it asked for SIGKILL)
                        killed: starting.signal == Some(libc::SIGKILL),
                    };
                    self.outbox.push_back(protocol::message(protocol::STARTED, id, &pid.to_le_bytes()));
                    if let Some(status) = self.unclaimed.remove(&pid) {
                        self.exited(run, status);
                        continue;
                    }
                    if let Some(signal) = starting.signal {
                        signal_group(pid, signal);
                    }
                    self.runs.push(run);
                }
                Err(e) => {
                    if let Some(pid) = child
                        && self.unclaimed.remove(&pid).is_none()
                    {
                        self.discard.insert(pid);
                    }
                    self.outbox.push_back(not_started(id, e.raw_os_error().unwrap_or(libc::EINVAL), &e.to_string()));
                }
            }
        }
    }

    /// Takes every message the worker sent; false when the worker is gone.
    fn receive(&mut self, buffer: &mut [u8]) -> bool {
        loop {
            let (n, fds) = match protocol::receive(&self.socket, buffer) {
                Ok(Some(received)) => received,
                Ok(None) => return false,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            };
            let Some((kind, id, body)) = protocol::parse(&buffer[..n]) else { continue };
            match kind {
                protocol::SPAWN_PART => self.partial.entry(id).or_default().extend_from_slice(body),
                protocol::SPAWN => {
                    let mut whole = self.partial.remove(&id).unwrap_or_default();
                    whole.extend_from_slice(body);
                    let refused = match (SpawnRequest::decode(&whole), <[OwnedFd; 3]>::try_from(fds)) {
                        (Some(request), Ok(stdio)) => self.spawn(id, request, stdio),
                        _ => Some(not_started(id, libc::EINVAL, "a malformed spawn request")),
                    };
                    self.outbox.extend(refused);
                }
                protocol::PING => self.outbox.push_back(protocol::message(protocol::PONG, id, &[])),
                protocol::LEASE => {
                    if let Some(deadline) = protocol::deadline_of(body) {
                        self.lease = Some(deadline);
                        self.lease_sent = true;
                    }
                }
                protocol::KILL => {
                    self.partial.remove(&id);
                    let Some(signal) = protocol::int_of(body) else { continue };
                    if let Some(run) = self.runs.iter().find(|run| run.id == id) {
                        signal_group(run.pid, signal);
                    } else if let Some(starting) = self.starting.get_mut(&id) {
                        starting.signal = Some(signal);
                        kill_waiting(starting, &self.unclaimed);
                    }
                }
                _ => {}
            }
        }
    }

    /// Hands an action to the starters (`starters`, `spawn`: a process group of its own); the
    /// reply to send now if it cannot be started (else its starter's outcome answers).
    fn spawn(&mut self, id: u64, request: SpawnRequest, stdio: [OwnedFd; 3]) -> Option<Vec<u8>> {
        let enforced = Enforced {
            memory_mb: request.memory_mb,
            cpu_secs: request.cpu_secs,
            open_files: request.open_files,
            lease_file: request.lease_file.clone(),
            uid: request.uid,
            processes: request.processes,
            file_size_bytes: request.file_size_bytes,
        };
        if request.lease_file.is_some() && request.lease_file != self.lease_file {
            self.lease_file = request.lease_file.clone();
            if !self.lease_sent {
                self.lease = None;
            }
        }
        let stderr = match report_handle(&stdio[2]) {
            Ok(file) => file,
            Err(e) => return Some(not_started(id, e.raw_os_error().unwrap_or(libc::EIO), &e.to_string())),
        };
        let pid = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
        let cancelled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rlimits, for_starter) = (rlimits(&enforced), (pid.clone(), cancelled.clone()));
        let job = starters::Job { id, rlimits, request, stdio, pid: for_starter.0, cancelled: for_starter.1 };
        if let Err(e) = self.starters.start(job) {
            return Some(not_started(id, e.raw_os_error().unwrap_or(libc::EAGAIN), &e.to_string()));
        }
        self.starting.insert(id, Starting { enforced, stderr, signal: None, pid, cancelled });
        None
    }

    /// Once the lease's deadline has passed (read again to be sure), every group is killed, each
    /// told on its stderr.
    fn check_lease(&mut self) {
        if self.lease_file.is_none() && !self.lease_sent {
            return;
        }
        if self.runs.iter().all(|run| run.killed) && self.starting.values().all(|s| s.signal == Some(libc::SIGKILL)) {
            return;
        }
        let now = boot_clock_ns();
        if self.lease.is_some_and(|deadline| now <= deadline) {
            return;
        }
        // the last deadline read holds when the file cannot be read: it runs out unless renewed
        // (a worker that sends its deadlines is not read from the file: what it sent holds)
        if !self.lease_sent
            && let Some(path) = self.lease_file.as_deref()
        {
            self.lease = read_lease(path).or(self.lease);
        }
        if self.lease.is_none_or(|deadline| now <= deadline) {
            return;
        }
        for run in self.runs.iter_mut().filter(|run| !run.killed) {
            let _ = run.stderr.write_all(format!("\n{LEASE_EXPIRED}\n").as_bytes());
            signal_group(run.pid, libc::SIGKILL);
            run.killed = true;
        }
        // (a start still in a starter's hands is killed once it has started, and now if it
        // waits)
        for starting in self.starting.values_mut().filter(|s| s.signal != Some(libc::SIGKILL)) {
            let _ = starting.stderr.write_all(format!("\n{LEASE_EXPIRED}\n").as_bytes());
            starting.signal = Some(libc::SIGKILL);
            kill_waiting(starting, &self.unclaimed);
        }
    }

    /// Looks at the groups of the runs that are due: one walk of `/proc` for all of them. A walk
    /// also serves the runs due within half their interval, so that runs started apart share
    /// their walks from then on.
    fn look(&mut self, now: Instant) {
        if !self.runs.iter().any(|run| !run.killed && run.enforced.looks() && run.next_look <= now) {
            return;
        }
        let groups: Vec<i32> = self.runs.iter().map(|run| run.pid).collect();
        let taken = Group::walk(&groups);
        for (run, (resident_bytes, cpu_secs)) in self.runs.iter_mut().zip(taken) {
            if run.killed || !run.enforced.looks() || !due(run.next_look, now - run.started, now) {
                continue;
            }
            run.cpu_secs = cpu_secs;
            run.next_look = now + look_interval(now - run.started);
            let group = Group { members: Vec::new(), resident_bytes, cpu_secs };
            if let Some(exceeded) = exceeded(&run.enforced, &group) {
                report(&mut run.stderr, &exceeded);
                signal_group(run.pid, libc::SIGKILL);
                run.killed = true;
            }
        }
    }

    /// Sends what waits in the outbox, as far as the socket takes it; false when the worker is
    /// gone.
    fn flush(&mut self) -> bool {
        while let Some(message) = self.outbox.front() {
            match protocol::send(self.socket.as_raw_fd(), message, &[]) {
                Ok(()) => {
                    self.outbox.pop_front();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// The worker is gone: every group is SIGKILLed, then the supervisor exits.
    fn kill_all_and_exit(&mut self) -> ! {
        for run in &self.runs {
            signal_group(run.pid, libc::SIGKILL);
        }
        for starting in self.starting.values_mut() {
            starting.signal = Some(libc::SIGKILL);
            kill_waiting(starting, &self.unclaimed);
        }
        std::process::exit(0)
    }
}

impl Enforced {
    /// Whether the group is looked at (a memory or CPU limit).
    fn looks(&self) -> bool {
        self.memory_mb.is_some() || self.cpu_secs.is_some()
    }
}

/// SIGKILLs the child of a start that has not come back from its starter (one that waits in its
/// exec or its `chdir`), if it has been made and not reaped (so its pid is still its own). Where
/// it waits killably (NFS, a FUSE request not yet read) it dies, its starter is let go, and its
/// start ends as not started.
fn kill_waiting(starting: &Starting, unclaimed: &HashMap<i32, i32>) {
    if starting.signal == Some(libc::SIGKILL) {
        starting.cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let pid = starting.pid.load(std::sync::atomic::Ordering::SeqCst);
    if starting.signal == Some(libc::SIGKILL) && pid > 0 && !unclaimed.contains_key(&pid) {
        // SAFETY: kill(2) of a child this process made and has not reaped.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

fn not_started(id: u64, errno: i32, message: &str) -> Vec<u8> {
    let mut body = errno.to_le_bytes().to_vec();
    body.extend_from_slice(message.as_bytes());
    protocol::message(protocol::NOT_STARTED, id, &body)
}

/// A handle of the supervisor's own on an action's stderr pipe, for the lines it writes there
/// (limit reports, the lease's end): a new open file description of the pipe
/// (`/proc/self/fd/N`), non-blocking, so that a full pipe that a frozen worker does not read
/// makes the supervisor drop its line rather than wait, which would hold up the lease and the
/// limits of every run. (The action's own description stays blocking.) A duplicate of the
/// descriptor, blocking, where `/proc` cannot open one.
fn report_handle(stderr: &OwnedFd) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/self/fd/{}", stderr.as_raw_fd());
    match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(file) => Ok(file),
        Err(_) => stderr.try_clone().map(std::fs::File::from),
    }
}

/// Writes the report line on the action's stderr in one write (a pipe keeps a write this short
/// whole).
fn report(stderr: &mut std::fs::File, report: &LimitReport) {
    let line = format!("\n{}{}\n", super::REPORT_PREFIX, serde_json::to_string(report).expect("a report serializes"));
    let _ = stderr.write_all(line.as_bytes());
}

#[allow(unsafe_code)]
fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group this supervisor made for a run
    // it has not reaped (so the id is still that group's).
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// The process tracing this one, if any (`TracerPid` of `/proc/self/status`).
fn tracer() -> std::io::Result<Option<i32>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let tracer = status
        .lines()
        .find_map(|line| line.strip_prefix("TracerPid:"))
        .and_then(|pid| pid.trim().parse::<i32>().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no TracerPid line"))?;
    Ok((tracer != 0).then_some(tracer))
}

/// Whether the worker is still this process's parent.
#[allow(unsafe_code)]
fn parent_alive(parent: i32) -> bool {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() == parent }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn young_runs_are_looked_at_often_and_old_ones_seldom() {
        assert_eq!(look_interval(Duration::ZERO), Duration::from_millis(50));
        assert_eq!(look_interval(Duration::from_millis(1999)), Duration::from_millis(50));
        assert_eq!(look_interval(Duration::from_secs(2)), Duration::from_millis(100));
        assert_eq!(look_interval(Duration::from_secs(10)), Duration::from_millis(500));
        assert_eq!(look_interval(Duration::from_secs(20)), Duration::from_secs(1));
        assert_eq!(look_interval(Duration::from_secs(600)), Duration::from_secs(1));
        let now = Instant::now();
        let old = Duration::from_secs(60);
        assert!(due(now, old, now) && due(now + Duration::from_millis(500), old, now), "a walk serves the next half");
        assert!(!due(now + Duration::from_millis(501), old, now));
        assert!(due(now + Duration::from_millis(25), Duration::ZERO, now));
        assert!(!due(now + Duration::from_millis(26), Duration::ZERO, now));
    }
}
