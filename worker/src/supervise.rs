//! The supervisor between the worker and its actions: one small process per worker that starts
//! every process action in a process group of its own, holds each group to its resource limits
//! and to the worker's lease, and takes every group down when the worker dies
//! (docs/adr/0009-one-supervisor-per-worker.md).
//!
//! A process group alone does not do it: the worker kills a group when its action ends, times out
//! or is canceled, but a worker that is SIGKILLed, killed by the OOM killer or aborted by a panic
//! kills nothing, and the action (with every grandchild it started) would run on outside the
//! record while its execution is retried elsewhere. So the worker starts its own binary once, in
//! supervisor mode (`attune-worker supervisor <worker pid> <socket fd>`, `server`), and talks to
//! it over a `SOCK_SEQPACKET` socketpair (`protocol`, `client`):
//!
//! - the worker sends each process action to start (program, arguments, directory, the whole
//!   environment, limits, user id) with its stdin, stdout and stderr pipe ends (`SCM_RIGHTS`);
//!   the supervisor starts it in a new process group (its pid is the group's id), with the
//!   rlimits below and `PR_SET_PDEATHSIG` (SIGKILL), by a clone that shares its memory until the
//!   exec (`spawn`), and answers started (its pid) or could not start (the errno: E2BIG is the
//!   request's fault, the rest the worker's);
//! - when an action's process ends, the supervisor SIGKILLs its group while the process is still
//!   a zombie (so the group id cannot be anyone else's yet), reaps it, and reports its wait
//!   status: the worker reads it as if it had started the action directly;
//! - the worker asks it to signal a group (SIGTERM at a timeout or cancel, SIGKILL after the
//!   grace, or when the lease runs out), which it does only for a run it has not reaped;
//! - when the worker is gone (the socket closes; `PR_SET_PDEATHSIG` as a backstop, checked
//!   against its parent since the signal is tied to the thread that started it), the supervisor
//!   SIGKILLs every group and exits;
//! - when the supervisor is gone (the socket closes on the worker's side), the worker SIGKILLs
//!   the groups it knows, ends those runs as killed by SIGKILL (`action_failed`, what a lost
//!   per-action supervisor gave), and starts a new supervisor for the next run.
//!
//! Limits (the action's `limits:`, filled and capped by the worker, see
//! `attune_core::pack::LimitSettings`):
//!
//! - memory: at each look the supervisor sums the resident memory (RSS, shared pages counted in
//!   each process) of the processes of each group; past the limit it kills the group. The
//!   action's process also gets `RLIMIT_AS` at twice the limit plus 1 GiB, a backstop for an
//!   allocation faster than the looks: it is address space, which programs reserve more of than
//!   they use, and when it is hit the program's allocation fails (its own error, `action_failed`).
//! - CPU time: the same look sums the CPU time of each group's processes (with the children they
//!   reaped); past the limit it kills the group. `RLIMIT_CPU` one second later (SIGXCPU, then
//!   SIGKILL a second after that) is the kernel's backstop, per process.
//! - open files: `RLIMIT_NOFILE`, per process (never above the supervisor's own hard limit); an
//!   open past it fails in the action (EMFILE), which fails with its own error (`action_failed`).
//! - processes and file size, for a run as a user of its own (`action_users`): `RLIMIT_NPROC`,
//!   which the kernel counts per user id (so the run's processes alone), and `RLIMIT_FSIZE` (a
//!   write past it raises SIGXFSZ, which `runner::classify` takes for `resource_limit`).
//!
//! A look is one walk of `/proc` for every run that is due (each process's `stat` read once and
//! counted to its group). A run is looked at every 50 ms for its first 2 s, then every twentieth
//! of its age, at most every second: a run that has lasted long changes slowly, and the rlimit
//! backstops hold meanwhile. The supervisor waits in `poll` for the worker, SIGCHLD and the next
//! thing due, so with no run it costs nothing.
//!
//! The lease (docs/adr/0008): the supervisor reads the worker's lease file when the deadline it
//! last read has passed (it wakes for it), and if it was not renewed it writes [`LEASE_EXPIRED`]
//! on each action's stderr and kills every group. A worker that is frozen does not stop it: what
//! the supervisor has to tell a worker that does not read waits in its own queue.
//!
//! When it kills a group for a limit, the supervisor first writes one line on the action's stderr
//! (it keeps a copy of the pipe's write end): [`REPORT_PREFIX`] and a JSON [`LimitReport`], in
//! one write. The worker takes a run that ended by a signal with such a line in its stderr for a
//! `resource_limit` failure ([`LimitReport::find`]). The line is the simplest channel that needs
//! no descriptor of its own: an action could print one too, but only to fail as `resource_limit`
//! instead of `action_failed`, neither retried nor counted against the worker.
//!
//! The per-action supervisor of before (`attune-worker supervise <worker pid> [--memory-mb=N]
//! [--cpu-secs=N] [--open-files=N] [--lease-file=PATH] [--uid=N] <program> <args>`: one exec of
//! this binary per action, leading the action's group, with the same limits and lease) stays as
//! a fallback: a run uses it only when the worker cannot start (or reach) a long-lived
//! supervisor. The worker library used without a supervisor (`Settings::supervisor` unset: unit
//! tests) runs actions directly, in groups of their own.
//!
//! A process that leaves the group with `setsid` escapes the group's kills; a run as a user of its
//! own is swept by its user id at its end (`action_users`). A cgroup per action would catch such
//! processes of any run, and count memory exactly; it needs a delegated cgroup hierarchy, which a
//! worker running as an ordinary user rarely has.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::Duration;

use attune_common::config::{ConfigError, Source, parse, read, read_optional};
use attune_core::pack::{LimitSettings, Limits};
use serde::{Deserialize, Serialize};

pub mod client;
mod protocol;
mod server;
mod spawn;
mod starters;

pub use protocol::{SpawnRequest, pipe};

/// The first argument that starts the worker's binary as a supervisor.
pub const MODE: &str = "supervise";

/// The program that starts supervisors, as `attune-worker` and `attune up` name it: the image the
/// process runs, however its file has since been replaced or removed (a package upgraded under a
/// running worker). Its path as started would run another version's supervisor, or none.
pub const OWN_BINARY: &str = "/proc/self/exe";

/// The name a supervisor started from `program` shows (its `argv[0]`): the worker's own path for
/// `OWN_BINARY`, so that `ps` and `pgrep -f` show `attune-worker supervisor ...` as before (and
/// the supervisor names itself after it, `name_after_argv0`).
pub fn shown_name(program: &std::path::Path) -> Option<std::path::PathBuf> {
    if program != std::path::Path::new(OWN_BINARY) {
        return None;
    }
    let path = std::env::current_exe().ok()?;
    // (the kernel's " (deleted)" once the file is gone is not part of the name)
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    let kept = bytes.strip_suffix(b" (deleted)").unwrap_or(bytes);
    Some(std::path::PathBuf::from(<OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(kept)))
}

/// How often the supervisor looks at its worker (besides the parent-death signal), and at the
/// group's memory and CPU time.
const LOOK: Duration = Duration::from_millis(50);

/// Every this many looks, the supervisor scans `/proc` for the processes of its group.
const SCAN_EVERY: u32 = 5;

/// Exit code when the action's program could not be started (as a shell would say).
pub const CANNOT_START: i32 = 127;

/// The start of the line a supervisor writes on stderr when it kills the group for a limit.
pub const REPORT_PREFIX: &str = "attune-worker supervise: limit exceeded ";

/// The line a supervisor writes on stderr when it kills the group because its worker's lease ran
/// out (`--lease-file`).
pub const LEASE_EXPIRED: &str = "attune-worker supervise: the worker's lease on its runs ran out";

/// The clock of lease files: `CLOCK_BOOTTIME` in nanoseconds, one clock for every process of the
/// host, and one that keeps counting while the machine sleeps.
#[allow(unsafe_code)]
pub fn boot_clock_ns() -> u128 {
    // SAFETY: clock_gettime writes into a local struct.
    let now = unsafe {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now);
        now
    };
    now.tv_sec as u128 * 1_000_000_000 + now.tv_nsec as u128
}

/// The lease file of this worker process, once it has one (`set_lease_file`).
static LEASE_FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// This worker's lease file, which every supervisor it starts watches (`--lease-file`).
pub fn lease_file() -> Option<&'static std::path::Path> {
    LEASE_FILE.get().map(std::path::PathBuf::as_path)
}

/// Gives this worker process its lease file (once; later calls change nothing).
pub fn set_lease_file(path: std::path::PathBuf) {
    let _ = LEASE_FILE.set(path);
}

/// Writes `deadline` (`boot_clock_ns`) into the lease file at `path`, whole (a reader sees the old
/// deadline or the new one).
pub fn write_lease(path: &std::path::Path, deadline: u128) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut next = path.as_os_str().to_owned();
    next.push(".next");
    // (not through a link someone left in its place)
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&next)?;
    file.write_all(deadline.to_string().as_bytes())?;
    std::fs::rename(&next, path)
}

/// A directory of this process's own for its lease file: made new (never one that was already
/// there) with mode 0700 under `parent`, so that no other user can plant anything in it.
pub fn private_lease_dir(parent: &std::path::Path, worker_id: i64) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = parent.join(format!("attune-worker-{worker_id}-{}-{:016x}", std::process::id(), rand::random::<u64>()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// The lease deadline written in a lease file (`boot_clock_ns` at which it runs out), if the file
/// holds one.
fn read_lease(path: &OsStr) -> Option<u128> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// If this process was started as a supervisor (a worker's, or one action's), supervises and
/// exits; otherwise returns.
pub fn run_if_asked() {
    let mut args = std::env::args_os().skip(1);
    let mode = args.next();
    let rest: Vec<OsString> = args.collect();
    if mode.as_deref() == Some(OsStr::new(server::MODE)) {
        name_after_argv0();
        std::process::exit(server::serve(&rest));
    }
    if mode.as_deref() == Some(OsStr::new(MODE)) {
        name_after_argv0();
        std::process::exit(supervise(&rest));
    }
}

/// A supervisor started through `OWN_BINARY` is named `exe` by the kernel (in `ps -e`, `top`,
/// `pgrep` without `-f`, the OOM killer's log): it takes the name of its `argv[0]`, the worker's.
#[allow(unsafe_code)]
fn name_after_argv0() {
    let Some(argv0) = std::env::args_os().next() else { return };
    let Some(name) = std::path::Path::new(&argv0).file_name() else { return };
    // (the kernel keeps 15 bytes and the NUL)
    let mut bytes: Vec<u8> = std::os::unix::ffi::OsStrExt::as_bytes(name).iter().copied().take(15).collect();
    bytes.push(0);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from the pointer,
    // which `bytes` is for the call.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, bytes.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
}

/// A worker's defaults and maximums for action limits, from its settings (`ATTUNE_ACTION_*`,
/// `ATTUNE_WORKER_OUTPUT_LIMIT_BYTES`).
pub fn limit_settings(source: &dyn Source) -> Result<LimitSettings, ConfigError> {
    let optional = |name: &str| read_optional(source, name).map(|value| parse::<u64>(name, &value)).transpose();
    Ok(LimitSettings {
        memory_mb: read(source, "ATTUNE_ACTION_MEMORY_MB")?,
        max_memory_mb: read(source, "ATTUNE_ACTION_MAX_MEMORY_MB")?,
        cpu_secs: optional("ATTUNE_ACTION_CPU_SECS")?,
        max_cpu_secs: optional("ATTUNE_ACTION_MAX_CPU_SECS")?,
        open_files: read(source, "ATTUNE_ACTION_OPEN_FILES")?,
        max_open_files: read(source, "ATTUNE_ACTION_MAX_OPEN_FILES")?,
        output_bytes: read(source, "ATTUNE_WORKER_OUTPUT_LIMIT_BYTES")?,
        max_output_bytes: read::<u64>(source, "ATTUNE_ACTION_MAX_OUTPUT_KB")?.saturating_mul(1024),
    })
}

/// The limits in force for an action whose stored `limits:` block is `asked` (`action.limits`),
/// under this worker's settings (read from its environment once), with `output_limit` (the
/// worker's `ATTUNE_WORKER_OUTPUT_LIMIT_BYTES`) as the default output. A block that does not
/// parse (stored by a newer version) is as none: the worker's defaults hold. The error names a
/// setting that does not parse.
pub fn limits_for(asked: Option<&serde_json::Value>, output_limit: usize) -> Result<Limits, String> {
    static SETTINGS: std::sync::OnceLock<Result<LimitSettings, String>> = std::sync::OnceLock::new();
    let settings = SETTINGS
        .get_or_init(|| limit_settings(&attune_common::settings::Environment).map_err(|e| e.to_string()))
        .clone()?;
    let settings = LimitSettings { output_bytes: output_limit as u64, ..settings };
    let asked = asked.and_then(|value| serde_json::from_value(value.clone()).ok());
    Ok(settings.in_force(asked.as_ref()))
}

/// The supervisor's options for `limits` (what it enforces; the output limit is the worker's).
pub fn limit_args(limits: &Limits) -> Vec<String> {
    let mut args = vec![format!("--memory-mb={}", limits.memory_mb), format!("--open-files={}", limits.open_files)];
    if let Some(secs) = limits.cpu_secs {
        args.push(format!("--cpu-secs={secs}"));
    }
    args
}

/// What the supervisor holds the action to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Enforced {
    memory_mb: Option<u64>,
    cpu_secs: Option<u64>,
    open_files: Option<u64>,
    /// The worker's lease file (docs/adr/0008): the group is killed once the deadline in it has
    /// passed, so that a worker that stalls (and stops renewing it) runs nothing on.
    lease_file: Option<OsString>,
    /// The user (and group) id the action runs as (`runner::ActionUsers`), when the worker drops
    /// root for it; its supplementary groups are dropped too. It starts with umask 077.
    uid: Option<u32>,
    /// `RLIMIT_NPROC`, for a run as a user of its own (`action_users`), whose processes are its
    /// alone.
    processes: Option<u64>,
    /// `RLIMIT_FSIZE`, in bytes: a write past it raises SIGXFSZ (`resource_limit`).
    file_size_bytes: Option<u64>,
}

/// `[worker pid, options..., program, args...]`.
fn parse_args(args: &[OsString]) -> Option<(i32, Enforced, &OsString, &[OsString])> {
    let parent = args.first()?.to_str()?.parse::<i32>().ok()?;
    let mut enforced = Enforced::default();
    let mut rest = &args[1..];
    while let Some(option) = rest.first().and_then(|a| a.to_str()).and_then(|a| a.strip_prefix("--")) {
        let (name, value) = option.split_once('=')?;
        if name == "lease-file" {
            enforced.lease_file = Some(OsString::from(value));
            rest = &rest[1..];
            continue;
        }
        if name == "uid" {
            enforced.uid = Some(value.parse::<u32>().ok().filter(|uid| *uid > 0)?);
            rest = &rest[1..];
            continue;
        }
        let value = Some(value.parse::<u64>().ok().filter(|v| *v > 0)?);
        match name {
            "memory-mb" => enforced.memory_mb = value,
            "cpu-secs" => enforced.cpu_secs = value,
            "open-files" => enforced.open_files = value,
            "processes" => enforced.processes = value,
            "file-size-bytes" => enforced.file_size_bytes = value,
            _ => return None,
        }
        rest = &rest[1..];
    }
    let (program, program_args) = rest.split_first()?;
    Some((parent, enforced, program, program_args))
}

/// Returns the exit code (or never returns, when it re-raises the signal that killed the action,
/// or kills its group).
#[allow(unsafe_code)]
fn supervise(args: &[OsString]) -> i32 {
    let Some((parent, enforced, program, program_args)) = parse_args(args) else {
        eprintln!(
            "attune-worker {MODE}: usage: attune-worker {MODE} <worker pid> [--memory-mb=N] [--cpu-secs=N] \
             [--open-files=N] [--lease-file=PATH] [--uid=N] [--processes=N] [--file-size-bytes=N] <program> \
             [args...]"
        );
        return 2;
    };
    let watched = watch_signals();
    if !parent_alive(parent) {
        // the worker died before the signal was asked for: nothing was started
        return CANNOT_START;
    }
    let rlimits = rlimits(&enforced);
    let own_user = enforced.uid.is_some();
    let mut command = std::process::Command::new(program);
    command.args(program_args);
    if let Some(uid) = enforced.uid {
        // std sets the group, drops the supplementary groups and sets the user, in the child,
        // before the limits below and the exec
        command.uid(uid).gid(uid);
    }
    // SAFETY: the closure runs in the forked child before exec and calls only umask, prctl and
    // setrlimit, which are async-signal-safe, on values computed before the fork; it allocates
    // nothing.
    unsafe {
        command.pre_exec(move || {
            if own_user {
                libc::umask(0o077);
                // (as the long-lived supervisor's start does: no exec gains a user or a capability)
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (resource, limit) in &rlimits {
                if libc::setrlimit(*resource, limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // std resets the signal mask and dispositions in the child before it runs the program
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("attune-worker: could not start {}: {e}", program.to_string_lossy());
            return CANNOT_START;
        }
    };
    let timeout = libc::timespec { tv_sec: 0, tv_nsec: LOOK.as_nanos() as libc::c_long };
    let mut group = Group::default();
    let mut looks: u32 = 0;
    // the last deadline read (a file that cannot be read keeps it: it runs out unless renewed)
    let mut lease = enforced.lease_file.as_deref().and_then(read_lease);
    loop {
        // SAFETY: waits for one of the blocked signals in `watched`; the info struct is local.
        let signal = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigtimedwait(&watched, &mut info, &timeout)
        };
        // SIGTERM and the like reached the whole group, the action included: it decides what
        // they mean, and its exit is what the supervisor reports
        if (signal == libc::SIGUSR1 || signal < 0) && !parent_alive(parent) {
            kill_group();
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                if let (Some(libc::SIGXCPU), Some(secs)) = (status.signal(), enforced.cpu_secs) {
                    // the kernel's backstop stopped it before a look did
                    report(&LimitReport {
                        limit: LimitKind::CpuSecs,
                        value: secs,
                        used: group.cpu_secs.max(secs as f64),
                    });
                }
                return mirror(status);
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("attune-worker {MODE}: lost the action: {e}");
                kill_group();
            }
        }
        if let Some(path) = enforced.lease_file.as_deref() {
            lease = read_lease(path).or(lease);
            if lease.is_some_and(|deadline| boot_clock_ns() > deadline) {
                let _ = std::io::stderr().write_all(format!("\n{LEASE_EXPIRED}\n").as_bytes());
                kill_group();
            }
        }
        if enforced.memory_mb.is_some() || enforced.cpu_secs.is_some() {
            group.look(looks.is_multiple_of(SCAN_EVERY));
            looks = looks.wrapping_add(1);
            if let Some(exceeded) = exceeded(&enforced, &group) {
                report(&exceeded);
                kill_group();
            }
        }
    }
}

/// Blocks the signals a supervisor waits for (a child's exit; SIGUSR1, asked for here as the
/// worker's death signal; and the terminal's and a stop's, which reach the action's group and are
/// the action's to answer) and returns them as a set, for `sigtimedwait` or a `signalfd`. Call it
/// while the process has one thread: the mask and the death signal are that thread's. (Actions
/// start with an empty mask: `spawn`, or std for a per-action
/// supervisor, resets it in the child.)
#[allow(unsafe_code)]
fn watch_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local set; sigprocmask and prctl change this process's
    // one thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGCHLD, libc::SIGUSR1, libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
            libc::sigaddset(&mut set, signal);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1 as libc::c_ulong, 0, 0, 0);
        set
    }
}

/// The rlimits the action's process starts with: the backstops for memory and CPU time (see the
/// module's comment), the open files, and for a run as a user of its own its processes and the
/// size of a file it writes, each at most the supervisor's own hard limit (which an
/// ordinary user cannot raise).
#[allow(unsafe_code)]
fn rlimits(enforced: &Enforced) -> Vec<(libc::__rlimit_resource_t, libc::rlimit)> {
    const MIB: u64 = 1 << 20;
    let wanted = [
        (libc::RLIMIT_AS, enforced.memory_mb.map(|mb| (mb.saturating_mul(2 * MIB).saturating_add(1024 * MIB), 0))),
        (libc::RLIMIT_CPU, enforced.cpu_secs.map(|secs| (secs.saturating_add(1), 1))),
        (libc::RLIMIT_NOFILE, enforced.open_files.map(|files| (files, 0))),
        (libc::RLIMIT_NPROC, enforced.processes.map(|processes| (processes, 0))),
        (libc::RLIMIT_FSIZE, enforced.file_size_bytes.map(|bytes| (bytes, 0))),
    ];
    let mut limits = Vec::new();
    for (resource, value) in wanted {
        let Some((soft, hard_margin)) = value else { continue };
        // SAFETY: getrlimit writes into a local struct.
        let current = unsafe {
            let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::getrlimit(resource, &mut current);
            current
        };
        let soft = soft.min(current.rlim_max);
        let hard = soft.saturating_add(hard_margin).min(current.rlim_max);
        limits.push((resource, libc::rlimit { rlim_cur: soft, rlim_max: hard }));
    }
    limits
}

/// The processes of the supervisor's group (itself excepted) and what they took at the last look.
#[derive(Debug, Default)]
struct Group {
    members: Vec<i32>,
    resident_bytes: u64,
    cpu_secs: f64,
}

impl Group {
    /// One walk of `/proc` for several groups: the resident bytes and CPU seconds of the
    /// processes of each of `groups` (process group ids), in their order.
    fn walk(groups: &[i32]) -> Vec<(u64, f64)> {
        let index: std::collections::HashMap<i32, usize> = groups.iter().enumerate().map(|(i, g)| (*g, i)).collect();
        let mut taken = vec![(0u64, 0u64); groups.len()];
        let mut text = String::with_capacity(512);
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().filter(|n| n.as_bytes()[0].is_ascii_digit()) else { continue };
            text.clear();
            let path = format!("/proc/{pid}/stat");
            let Ok(mut file) = std::fs::File::open(&path) else { continue };
            if std::io::Read::read_to_string(&mut file, &mut text).is_err() {
                continue;
            }
            if let Some(sample) = parse_stat(&text)
                && let Some(i) = index.get(&sample.group)
            {
                taken[*i].0 += sample.resident_pages;
                taken[*i].1 += sample.cpu_ticks;
            }
        }
        let (page, tick) = units();
        taken.into_iter().map(|(pages, ticks)| (pages.saturating_mul(page), ticks as f64 / tick as f64)).collect()
    }

    /// Reads the members' memory and CPU time; with `scan`, finds the members anew in `/proc`.
    fn look(&mut self, scan: bool) {
        let me = std::process::id() as i32;
        if scan {
            self.members = std::fs::read_dir("/proc")
                .map(|dir| dir.flatten().filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok()).collect())
                .unwrap_or_default();
        }
        let (page, tick) = units();
        let (mut pages, mut ticks) = (0u64, 0u64);
        self.members.retain(|pid| {
            let Some(stat) = (*pid != me).then(|| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()).flatten()
            else {
                return false;
            };
            match parse_stat(&stat) {
                Some(sample) if sample.group == me => {
                    pages += sample.resident_pages;
                    ticks += sample.cpu_ticks;
                    true
                }
                _ => false,
            }
        });
        self.resident_bytes = pages.saturating_mul(page);
        self.cpu_secs = ticks as f64 / tick as f64;
    }
}

/// The page size and the clock ticks per second `/proc/<pid>/stat` counts in.
#[allow(unsafe_code)]
fn units() -> (u64, u64) {
    // SAFETY: sysconf has no preconditions.
    let (page, tick) = unsafe { (libc::sysconf(libc::_SC_PAGESIZE), libc::sysconf(libc::_SC_CLK_TCK)) };
    (u64::try_from(page).unwrap_or(4096).max(1), u64::try_from(tick).unwrap_or(100).max(1))
}

/// One process, from its `/proc/<pid>/stat` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    /// Its process group.
    group: i32,
    resident_pages: u64,
    /// User and system time, its own and its reaped children's, in clock ticks.
    cpu_ticks: u64,
}

/// `pid (comm) state ppid pgrp ...`: the command may hold spaces and parentheses, so the fields
/// are counted from the last `)` (state is field 3; pgrp 5, utime 14, stime 15, cutime 16,
/// cstime 17, rss 24; proc(5)).
fn parse_stat(stat: &str) -> Option<Sample> {
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<i64>().ok();
    let cpu: i64 = [14, 15, 16, 17].into_iter().map(field).sum::<Option<i64>>()?;
    Some(Sample {
        group: i32::try_from(field(5)?).ok()?,
        resident_pages: u64::try_from(field(24)?).unwrap_or(0),
        cpu_ticks: u64::try_from(cpu).unwrap_or(0),
    })
}

/// The limit the group passed at its last look, if any.
fn exceeded(enforced: &Enforced, group: &Group) -> Option<LimitReport> {
    if let Some(mb) = enforced.memory_mb
        && group.resident_bytes > mb.saturating_mul(1 << 20)
    {
        return Some(LimitReport {
            limit: LimitKind::MemoryMb,
            value: mb,
            used: group.resident_bytes as f64 / (1 << 20) as f64,
        });
    }
    if let Some(secs) = enforced.cpu_secs
        && group.cpu_secs >= secs as f64
    {
        return Some(LimitReport { limit: LimitKind::CpuSecs, value: secs, used: group.cpu_secs });
    }
    None
}

/// Which limit a run passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    MemoryMb,
    CpuSecs,
}

/// What the supervisor says when it kills the group for a limit: the limit, its value (MiB or
/// seconds) and what the group had taken (the same unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LimitReport {
    pub limit: LimitKind,
    pub value: u64,
    pub used: f64,
}

impl LimitReport {
    /// The last report line in an action's stderr, if there is one.
    pub fn find(stderr: &str) -> Option<LimitReport> {
        stderr.lines().rev().find_map(|line| serde_json::from_str(line.strip_prefix(REPORT_PREFIX)?).ok())
    }

    /// The execution's error.
    pub fn error(&self) -> String {
        match self.limit {
            LimitKind::MemoryMb => format!(
                "memory limit {} MiB exceeded (resident {} MiB); the action's processes were killed",
                self.value,
                self.used.ceil() as u64
            ),
            LimitKind::CpuSecs => format!(
                "cpu time limit {} s exceeded (used {:.2} s); the action's processes were killed",
                self.value, self.used
            ),
        }
    }
}

/// Writes the report line on stderr in one write (a pipe keeps a write this short whole).
fn report(report: &LimitReport) {
    let line = format!("\n{REPORT_PREFIX}{}\n", serde_json::to_string(report).expect("a report serializes"));
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Whether the worker is still this process's parent (after its death the process is adopted by
/// init or a subreaper).
#[allow(unsafe_code)]
fn parent_alive(parent: i32) -> bool {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() == parent }
}

/// SIGKILL to the supervisor's own process group: the action, its descendants, and itself.
#[allow(unsafe_code)]
fn kill_group() -> ! {
    // SAFETY: kill(0, SIGKILL) signals the caller's process group, which it leads.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
    std::process::exit(137)
}

/// Exits as the action did: with its code, or by the same signal.
#[allow(unsafe_code)]
fn mirror(status: std::process::ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    let signal = status.signal().unwrap_or(libc::SIGKILL);
    // SAFETY: no core file for the supervisor (the action's crash is the action's), then
    // restores the default action for `signal`, unblocks it and raises it on this
    // single-threaded process, which then ends as the action did.
    unsafe {
        let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
    128 + signal
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_common::settings::{Defaults, Vars};

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_options_come_between_the_worker_pid_and_the_program() {
        let args = os(&["42", "--memory-mb=128", "--cpu-secs=1", "--open-files=16", "/usr/bin/python3", "--x=1"]);
        let (parent, enforced, program, rest) = parse_args(&args).unwrap();
        assert_eq!((parent, program.to_str(), rest), (42, Some("/usr/bin/python3"), &os(&["--x=1"])[..]));
        assert_eq!(
            enforced,
            Enforced { memory_mb: Some(128), cpu_secs: Some(1), open_files: Some(16), ..Enforced::default() }
        );
        let leased = os(&["42", "--lease-file=/run/w.lease", "--memory-mb=8", "/bin/sh"]);
        let (_, enforced, _, _) = parse_args(&leased).unwrap();
        assert_eq!(
            enforced,
            Enforced { memory_mb: Some(8), lease_file: Some(OsString::from("/run/w.lease")), ..Enforced::default() }
        );
        let as_user = os(&["42", "--uid=1900000001", "--processes=256", "--file-size-bytes=1024", "/bin/sh"]);
        assert_eq!(
            parse_args(&as_user).unwrap().1,
            Enforced {
                uid: Some(1_900_000_001),
                processes: Some(256),
                file_size_bytes: Some(1024),
                ..Enforced::default()
            }
        );
        assert!(parse_args(&os(&["42", "--uid=0", "/bin/sh"])).is_none(), "never root by option");
        let plain = os(&["42", "/bin/sh", "run.sh"]);
        let (_, enforced, program, _) = parse_args(&plain).unwrap();
        assert_eq!((enforced, program.to_str()), (Enforced::default(), Some("/bin/sh")));
        for bad in [&["x", "/bin/sh"][..], &["42"], &["42", "--memory-mb=0", "/bin/sh"], &["42", "--swap=1", "/bin/sh"]]
        {
            assert_eq!(parse_args(&os(bad)), None, "{bad:?}");
        }
        let limits = Limits { memory_mb: 128, cpu_secs: Some(1), open_files: 16, output_bytes: 1024 };
        let mut args = vec!["42".to_string()];
        args.extend(limit_args(&limits));
        args.push("/bin/sh".into());
        let args: Vec<OsString> = args.into_iter().map(OsString::from).collect();
        assert_eq!(
            parse_args(&args).unwrap().1,
            Enforced { memory_mb: Some(128), cpu_secs: Some(1), open_files: Some(16), ..Enforced::default() }
        );
    }

    #[test]
    fn a_lease_file_holds_its_deadline_whole_and_a_missing_one_holds_none() {
        let path = std::env::temp_dir().join(format!("attune-lease-test-{:016x}", rand::random::<u64>()));
        assert_eq!(read_lease(path.as_os_str()), None);
        let deadline = boot_clock_ns() + 5_000_000_000;
        write_lease(&path, deadline).unwrap();
        assert_eq!(read_lease(path.as_os_str()), Some(deadline));
        write_lease(&path, deadline + 1).unwrap();
        assert_eq!(read_lease(path.as_os_str()), Some(deadline + 1));
        assert!(boot_clock_ns() < deadline, "the boot clock counts in nanoseconds");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_report_line_is_found_in_stderr_and_names_the_limit() {
        let memory = LimitReport { limit: LimitKind::MemoryMb, value: 256, used: 256.3 };
        let cpu = LimitReport { limit: LimitKind::CpuSecs, value: 1, used: 1.004 };
        let line = |r: &LimitReport| format!("{REPORT_PREFIX}{}", serde_json::to_string(r).unwrap());
        assert_eq!(line(&memory), format!("{REPORT_PREFIX}{{\"limit\":\"memory_mb\",\"value\":256,\"used\":256.3}}"));
        let stderr = format!("Traceback ...\n{}\nlate output of a dying child\n", line(&memory));
        assert_eq!(LimitReport::find(&stderr), Some(memory));
        assert_eq!(LimitReport::find(&format!("{}\n{}", line(&memory), line(&cpu))), Some(cpu), "the last one");
        for none in
            ["", "plain stderr\n", "attune-worker supervise: limit exceeded {oops}\n", "  {\"limit\":\"memory_mb\"}"]
        {
            assert_eq!(LimitReport::find(none), None, "{none}");
        }
        assert_eq!(
            memory.error(),
            "memory limit 256 MiB exceeded (resident 257 MiB); the action's processes were killed"
        );
        assert_eq!(cpu.error(), "cpu time limit 1 s exceeded (used 1.00 s); the action's processes were killed");
    }

    #[test]
    fn a_stat_line_gives_group_memory_and_cpu_time() {
        let stat = "4242 (a (weird) name) S 1 4200 4200 0 -1 4194560 100 0 0 0 150 50 7 3 20 0 1 0 \
                    1000 300000000 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(stat), Some(Sample { group: 4200, resident_pages: 2560, cpu_ticks: 210 }));
        assert_eq!(parse_stat("4242 (sh) S 1"), None);
        let mine = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_stat(&mine).unwrap().resident_pages > 0, "{mine}");
    }

    #[test]
    fn the_first_limit_passed_is_reported() {
        let enforced = Enforced { memory_mb: Some(100), cpu_secs: Some(2), ..Enforced::default() };
        let group = |mb: u64, secs: f64| Group { members: vec![], resident_bytes: mb << 20, cpu_secs: secs };
        assert_eq!(exceeded(&enforced, &group(100, 1.99)), None, "at the limit is within it");
        assert_eq!(exceeded(&enforced, &group(101, 1.0)).unwrap().limit, LimitKind::MemoryMb);
        assert_eq!(exceeded(&enforced, &group(10, 2.0)).unwrap().limit, LimitKind::CpuSecs);
        assert_eq!(exceeded(&Enforced::default(), &group(1 << 20, 1e9)), None);
    }

    #[test]
    fn the_settings_default_and_parse() {
        let defaults = limit_settings(&Defaults).unwrap();
        assert_eq!(
            defaults,
            LimitSettings {
                memory_mb: 1024,
                max_memory_mb: 4096,
                cpu_secs: None,
                max_cpu_secs: None,
                open_files: 1024,
                max_open_files: 65536,
                output_bytes: 65536,
                max_output_bytes: 1 << 20,
            }
        );
        let set =
            limit_settings(&Vars(&[("ATTUNE_ACTION_CPU_SECS", "60"), ("ATTUNE_ACTION_MAX_CPU_SECS", "600")])).unwrap();
        assert_eq!((set.cpu_secs, set.max_cpu_secs), (Some(60), Some(600)));
        let err = limit_settings(&Vars(&[("ATTUNE_ACTION_MEMORY_MB", "lots")])).unwrap_err();
        assert!(err.to_string().contains("ATTUNE_ACTION_MEMORY_MB"), "{err}");
    }

    #[test]
    fn the_backstops_sit_above_the_limits() {
        let limits = rlimits(&Enforced {
            memory_mb: Some(128),
            cpu_secs: Some(1),
            open_files: Some(16),
            processes: Some(256),
            file_size_bytes: Some(1 << 30),
            ..Enforced::default()
        });
        let of = |resource| limits.iter().find(|(r, _)| *r == resource).map(|(_, l)| (l.rlim_cur, l.rlim_max));
        // (the test's own hard limits are far above these)
        assert_eq!(of(libc::RLIMIT_AS), Some(((256 + 1024) << 20, (256 + 1024) << 20)));
        assert_eq!(of(libc::RLIMIT_CPU), Some((2, 3)), "SIGXCPU a second past the limit, SIGKILL one more");
        assert_eq!(of(libc::RLIMIT_NOFILE), Some((16, 16)));
        assert_eq!(of(libc::RLIMIT_NPROC), Some((256, 256)));
        assert_eq!(of(libc::RLIMIT_FSIZE), Some((1 << 30, 1 << 30)));
        assert!(rlimits(&Enforced::default()).is_empty());
    }
}
