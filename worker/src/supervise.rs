//! The supervisor between the worker and an action: a small process that owns the action's
//! process group and takes it down when the worker dies.
//!
//! A process group alone does not do it: the worker kills the group when an action ends, times
//! out or is canceled, but a worker that is SIGKILLed, killed by the OOM killer or aborted by a
//! panic kills nothing, and the action (with every grandchild it started) would run on outside
//! the record while its execution is retried elsewhere. So the worker starts each action through
//! its own binary in supervisor mode (`attune-worker supervise <worker pid> <program> <args>`):
//!
//! - the supervisor is the leader of a new process group, and the action and everything it starts
//!   (unless it leaves the group on purpose, with `setsid`) belong to it;
//! - it asks the kernel for a signal when its parent dies (`PR_SET_PDEATHSIG`), and also checks
//!   its parent every 250 ms (the signal is tied to the thread that started it); when the worker
//!   is gone it SIGKILLs the whole group, itself included: within about a quarter of a second;
//! - otherwise it waits for the action and exits as the action did (the same code, or the same
//!   signal), so the worker reads the action's status as if it had started it directly.
//!
//! A cgroup per action would also catch processes that leave the group with `setsid`; it needs a
//! delegated cgroup hierarchy, which a worker running as an ordinary user rarely has.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// The first argument that starts the worker's binary as a supervisor.
pub const MODE: &str = "supervise";

/// How often the supervisor checks that its worker is alive, besides the parent-death signal.
const PARENT_CHECK: Duration = Duration::from_millis(250);

/// Exit code when the action's program could not be started (as a shell would say).
pub const CANNOT_START: i32 = 127;

/// If this process was started as a supervisor, supervises and exits; otherwise returns.
pub fn run_if_asked() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(MODE)) {
        return;
    }
    let rest: Vec<OsString> = args.collect();
    std::process::exit(supervise(&rest));
}

/// `[worker pid, program, args...]`; returns the exit code (or never returns, when it re-raises
/// the signal that killed the action, or kills its group).
#[allow(unsafe_code)]
fn supervise(args: &[OsString]) -> i32 {
    let (Some(parent), Some(program)) = (args.first().and_then(|p| p.to_str()?.parse::<i32>().ok()), args.get(1))
    else {
        eprintln!("attune-worker {MODE}: usage: attune-worker {MODE} <worker pid> <program> [args...]");
        return 2;
    };
    // SAFETY: sigset manipulation on a local set, sigprocmask and prctl on this process, and
    // getppid: no memory is shared with anything else, and the process has one thread.
    let watched = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGCHLD, libc::SIGUSR1, libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
            libc::sigaddset(&mut set, signal);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1 as libc::c_ulong, 0, 0, 0);
        set
    };
    if !parent_alive(parent) {
        // the worker died before the signal was asked for: nothing was started
        return CANNOT_START;
    }
    // std resets the signal mask and dispositions in the child before it runs the program
    let mut child = match std::process::Command::new(program).args(&args[2..]).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("attune-worker: could not start {}: {e}", program.to_string_lossy());
            return CANNOT_START;
        }
    };
    let timeout = libc::timespec { tv_sec: 0, tv_nsec: PARENT_CHECK.as_nanos() as libc::c_long };
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
            Ok(Some(status)) => return mirror(status),
            Ok(None) => {}
            Err(e) => {
                eprintln!("attune-worker {MODE}: lost the action: {e}");
                kill_group();
            }
        }
    }
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
