//! How the supervisor starts an action's process: a `clone` that shares the supervisor's memory
//! until the child execs (`CLONE_VM | CLONE_VFORK`, what `posix_spawn` does), instead of the `fork`
//! std's `Command` makes whenever code must run in the child (rlimits, the parent-death signal). A
//! fork copies the supervisor's page tables and the exec then tears the copy down: at `core.echo`'s
//! maximum rate that was about a tenth of the machine, more than the supervisor's every other cost
//! (docs/bench/log/2026-11-26-5-real-actions-a-start-without-a-fork.md).
//!
//! The child runs on a stack of its own while the thread that made it (one of the supervisor's
//! `starters`, off its loop) is suspended, and makes only system calls, on values prepared before
//! the clone: it allocates nothing and takes no lock. In order, as
//! std's `Command` does them: its stdin, stdout and stderr; its group, supplementary groups and
//! user (raw system calls, for this one process alone, with no inheritable or ambient capability),
//! and then not dumpable, with umask 077; its directory; a process group of its own; the rlimits;
//! `PR_SET_PDEATHSIG` (SIGKILL) and a check that the supervisor is still its parent; the default
//! action for SIGPIPE and for every signal the supervisor handles; an empty signal mask; the exec.
//! Every signal is blocked in the supervisor across the clone, so that none is handled in the
//! child before its dispositions are reset. A step that fails leaves its errno where the
//! supervisor reads it once the child has exited, and the supervisor reaps it.
//!
//! A run as another user takes the same path, with care for the moments its child is that user
//! while it still shares the supervisor's memory (from its change of user until the kernel has
//! switched it to the new program's memory, which comes after the supervisor is let go). The child
//! changes its real and effective user but keeps a saved user of root (`setresuid(uid, uid, 0)`)
//! until the exec, which sets the saved user to the effective one and leaves the program no
//! permitted, effective or ambient capability: its inheritable set, and with it the ambient one
//! (which a saved user of root would keep), is emptied before. Until then no process of that user
//! may trace the child or open its memory (the kernel asks for all three of the child's user ids
//! to be the tracer's), whatever the memory's dumpability. And the supervisor is not dumpable from
//! the start of `server::serve`, as the worker is not: the child asks for that again after its
//! change of user (or when a step after its change of group fails), since the kernel then sets
//! the memory's dumpability to `fs.suid_dumpable`.
//!
//! No other process of that user runs meanwhile: the worker kills every process of a user id
//! before it hands the id out again (`action_users`), so nothing an earlier action left behind
//! with `setsid` can signal the child and stop it before its exec. (Were one to, that start would
//! hold its starter, as a stalled exec does; the loop goes on for every other run, and the
//! worker gives the run up as the platform's loss after `ANSWER_PATIENCE`, `client`.)

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};

/// The child's stack: it makes system calls only, through libc's thin wrappers.
const STACK_BYTES: usize = 64 * 1024;

/// `capget`/`capset`'s header (`_LINUX_CAPABILITY_VERSION_3`, this thread) and its two words of
/// capabilities (0 to 31, 32 to 63).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// A process to start, with everything the child needs prepared.
pub(super) struct Spawn {
    program: CString,
    /// NUL-terminated arrays of pointers into `_strings`.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    stdio: [RawFd; 3],
    uid: Option<u32>,
    rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The signals whose disposition the child sets back to the default.
    reset: &'static [libc::c_int],
    parent: libc::pid_t,
    _strings: Vec<CString>,
}

/// What the child reads, and where it writes the errno of a step that failed.
struct Child<'a> {
    spawn: &'a Spawn,
    failed: &'a AtomicI32,
}

impl Spawn {
    /// `program` with `args` (its `argv[0]` is `program` as given), in `cwd`, with exactly `env`
    /// (`NAME=value` entries; the last of a name counts, one without `=` is left out) and the given
    /// stdio (descriptors above 2). A `program` without a `/` is looked up in the `PATH` of `env`,
    /// else the supervisor's, else `/bin:/usr/bin`. An argument, variable or path with a NUL byte
    /// is refused (InvalidInput).
    pub(super) fn new(
        program: &OsStr,
        args: &[OsString],
        cwd: &OsStr,
        env: &[OsString],
        stdio: [RawFd; 3],
        uid: Option<u32>,
        rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    ) -> std::io::Result<Spawn> {
        let c = |bytes: &[u8]| {
            CString::new(bytes)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in the request"))
        };
        let mut variables: BTreeMap<&[u8], &[u8]> = BTreeMap::new();
        for entry in env {
            let bytes = entry.as_bytes();
            if let Some(at) = bytes.iter().position(|b| *b == b'=') {
                variables.insert(&bytes[..at], &bytes[at + 1..]);
            }
        }
        let path = variables.get(&b"PATH"[..]).map(|path| path.to_vec());
        let mut strings = Vec::with_capacity(1 + args.len() + variables.len());
        strings.push(c(program.as_bytes())?);
        let program = c(&resolve(program.as_bytes(), path))?;
        for arg in args {
            strings.push(c(arg.as_bytes())?);
        }
        let argc = strings.len();
        for (name, value) in &variables {
            strings.push(c(&[*name, b"=", *value].concat())?);
        }
        let pointers = |strings: &[CString]| {
            strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect::<Vec<_>>()
        };
        Ok(Spawn {
            argv: pointers(&strings[..argc]),
            envp: pointers(&strings[argc..]),
            program,
            cwd: c(cwd.as_bytes())?,
            stdio,
            uid,
            rlimits,
            reset: handled_signals(),
            parent: std::process::id() as libc::pid_t,
            _strings: strings,
        })
    }

    /// Starts it; its pid (the leader of its own process group). `stack` is the child's, reused
    /// from one start to the next. A child that failed before its exec is reaped here.
    #[allow(unsafe_code)]
    #[cfg(test)]
    pub(super) fn start(&self, stack: &mut Vec<u8>) -> std::io::Result<libc::pid_t> {
        match self.clone_child(stack, &AtomicI32::new(0))? {
            (pid, 0) => Ok(pid),
            (pid, errno) => {
                // SAFETY: reaps the child this call made, which has exited.
                unsafe {
                    let mut status = 0;
                    libc::waitpid(pid, &mut status, 0);
                }
                Err(std::io::Error::from_raw_os_error(errno))
            }
        }
    }

    /// Makes the child and returns once it has exec'd or failed: its pid, and the errno of the
    /// step that failed (0 once it exec'd). A child that failed has exited, and is left for the
    /// caller to reap. Only the calling thread is suspended meanwhile (`CLONE_VFORK`), and the
    /// child's pid is in `pid` from the moment it exists (`CLONE_PARENT_SETTID`), so that another
    /// thread can kill a start that waits. `stack` is the child's, reused from one start to the
    /// next.
    #[allow(unsafe_code)]
    pub(super) fn clone_child(&self, stack: &mut Vec<u8>, pid: &AtomicI32) -> std::io::Result<(libc::pid_t, i32)> {
        stack.resize(STACK_BYTES, 0);
        let failed = AtomicI32::new(0);
        let child = Child { spawn: self, failed: &failed };
        // SAFETY: the clone's child runs `child_main` on `stack` (its own, 16-byte aligned top)
        // in this process's memory while this thread is suspended (CLONE_VFORK) until it execs
        // or exits, reading `child`, which outlives it, and writing only `failed` (and, with a
        // change of user, the memory's dumpability: not dumpable). Every signal is blocked in
        // this thread across the clone and its mask restored after.
        let (pid, clone_error) = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
            let top = stack.as_mut_ptr().add(stack.len());
            let top = top.sub(top as usize % 16);
            let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PARENT_SETTID | libc::SIGCHLD;
            let arg = &child as *const Child as *mut libc::c_void;
            let pid = libc::clone(child_main, top as *mut libc::c_void, flags, arg, pid.as_ptr());
            let clone_error = std::io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            (pid, clone_error)
        };
        if pid < 0 {
            return Err(clone_error);
        }
        Ok((pid, failed.load(Ordering::SeqCst)))
    }
}

/// The child: its steps, then the exec; if a step fails, its errno for the supervisor.
#[allow(unsafe_code)]
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Child` that `start` passed, alive until this process execs or exits.
    let child = unsafe { &*(arg as *const Child) };
    // SAFETY: system calls on the values `Spawn::new` prepared (see `steps`).
    let errno = unsafe { steps(child.spawn) }.max(1);
    child.failed.store(errno, Ordering::SeqCst);
    if child.spawn.uid.is_some() {
        // (a change of group or user before the step that failed set the shared memory's
        // dumpability to `fs.suid_dumpable`)
        // SAFETY: changes a flag of this process's memory, which the supervisor shares.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    }
    // SAFETY: _exit ends this process at once, without running the supervisor's exit handlers.
    unsafe { libc::_exit(127) }
}

/// The child's steps up to the exec; returns only when one failed, with its errno.
///
/// # Safety
/// Only in the child of `Spawn::start`, with `spawn` alive.
#[allow(unsafe_code)]
unsafe fn steps(spawn: &Spawn) -> libc::c_int {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    // SAFETY (the whole block): system calls on this process alone, with pointers to
    // NUL-terminated strings and arrays that `spawn` owns.
    unsafe {
        for (target, fd) in spawn.stdio.iter().enumerate() {
            let target = target as RawFd;
            // (dup2 onto itself would leave close-on-exec set)
            let done = if *fd == target { libc::fcntl(*fd, libc::F_SETFD, 0) } else { libc::dup2(*fd, target) };
            if done < 0 {
                return errno();
            }
        }
        if let Some(uid) = spawn.uid {
            // (raw: glibc's wrappers would try to change every thread of the supervisor)
            if libc::syscall(libc::SYS_setgid, uid as libc::c_long) != 0 {
                return errno();
            }
            if libc::getuid() == 0
                && libc::syscall(libc::SYS_setgroups, 0 as libc::c_long, std::ptr::null::<libc::gid_t>()) != 0
            {
                return errno();
            }
            // (the inheritable set survives the change and the exec, and would give the action a
            // capability through a program whose file marks it inheritable; emptying it empties the
            // ambient set too, which a saved user of root would otherwise keep for the exec)
            let mut header = CapHeader { version: CAP_VERSION_3, pid: 0 };
            let mut caps = [CapData::default(); 2];
            if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, caps.as_mut_ptr()) != 0 {
                return errno();
            }
            caps.iter_mut().for_each(|word| word.inheritable = 0);
            if libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, caps.as_ptr()) != 0 {
                return errno();
            }
            // (root stays the saved user until the exec, so that this user cannot trace this
            // child while it shares the supervisor's memory; the exec drops it)
            let (uid, root) = (uid as libc::c_long, 0 as libc::c_long);
            if libc::syscall(libc::SYS_setresuid, uid, uid, root) != 0 {
                return errno();
            }
            // (the change set the shared memory's dumpability to `fs.suid_dumpable`)
            if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
                return errno();
            }
            // no exec gains a user, a group or a capability from here on (set-user-id files, file
            // capabilities): every process of the run keeps the run's user as its real one, the
            // id its end's sweep asks the kernel about (`action_users::no_process_is_really`)
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return errno();
            }
            // (what it makes in its private temp directory, or anywhere, is its own alone; the
            // umask is this child's, which shares the supervisor's memory, not its file system
            // state)
            libc::umask(0o077);
        }
        if libc::chdir(spawn.cwd.as_ptr()) != 0 || libc::setpgid(0, 0) != 0 {
            return errno();
        }
        for (resource, limit) in &spawn.rlimits {
            if libc::setrlimit(*resource, limit) != 0 {
                return errno();
            }
        }
        // (asked after the change of user, which clears it; the parent checked after, in case it
        // died before)
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        if libc::getppid() != spawn.parent {
            return libc::ESRCH;
        }
        for signal in spawn.reset.iter().copied().chain(std::iter::once(libc::SIGPIPE)) {
            libc::signal(signal, libc::SIG_DFL);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(spawn.program.as_ptr(), spawn.argv.as_ptr(), spawn.envp.as_ptr());
        errno()
    }
}

/// The signals that run a handler of the supervisor's (std's, for a stack overflow): the child
/// sets them back to the default before anything could deliver one. Read once: the supervisor
/// sets no handler after it starts.
fn handled_signals() -> &'static [libc::c_int] {
    static HANDLED: std::sync::OnceLock<Vec<libc::c_int>> = std::sync::OnceLock::new();
    HANDLED.get_or_init(read_handled_signals)
}

#[allow(unsafe_code)]
fn read_handled_signals() -> Vec<libc::c_int> {
    (1..libc::SIGRTMIN())
        .filter(|signal| {
            // SAFETY: sigaction with no new action only reads the disposition into a local struct.
            let handler = unsafe {
                let mut current: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(*signal, std::ptr::null(), &mut current) != 0 {
                    return false;
                }
                current.sa_sigaction
            };
            handler != libc::SIG_DFL && handler != libc::SIG_IGN
        })
        .collect()
}

/// `program` as the path to exec: as given when it contains a `/`, else the first executable
/// file of that name in `path` (the request's `PATH`, else the supervisor's), else as given (its
/// exec then fails: ENOENT).
fn resolve(program: &[u8], path: Option<Vec<u8>>) -> Vec<u8> {
    if program.contains(&b'/') {
        return program.to_vec();
    }
    let path = path
        .or_else(|| std::env::var_os("PATH").map(|path| path.as_bytes().to_vec()))
        .unwrap_or_else(|| b"/bin:/usr/bin".to_vec());
    for dir in path.split(|b| *b == b':').filter(|dir| !dir.is_empty()) {
        let candidate = [dir, b"/", program].concat();
        let file = std::path::Path::new(OsStr::from_bytes(&candidate));
        if file.metadata().is_ok_and(|meta| {
            use std::os::unix::fs::PermissionsExt;
            meta.is_file() && meta.permissions().mode() & 0o111 != 0
        }) {
            return candidate;
        }
    }
    program.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsRawFd, OwnedFd};

    fn pipe() -> (OwnedFd, OwnedFd) {
        super::super::protocol::pipe().unwrap()
    }

    #[allow(unsafe_code)]
    fn wait(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        // SAFETY: reaps this test's own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    /// Runs `script` under `sh` with `env`; its exit code and stdout.
    fn sh(script: &str, env: &[&str], rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>) -> (i32, String) {
        sh_as(None, script, env, rlimits)
    }

    fn sh_as(
        uid: Option<u32>,
        script: &str,
        env: &[&str],
        rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    ) -> (i32, String) {
        let (stdin, _keep) = pipe();
        let (out, out_w) = pipe();
        let (_err, err_w) = pipe();
        let env: Vec<OsString> = env.iter().map(OsString::from).collect();
        let spawn = Spawn::new(
            OsStr::new("sh"),
            &["-c".into(), script.into()],
            OsStr::new("/tmp"),
            &env,
            [stdin.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
            uid,
            rlimits,
        )
        .unwrap();
        let pid = spawn.start(&mut Vec::new()).unwrap();
        drop((out_w, err_w));
        let mut output = String::new();
        std::fs::File::from(out.try_clone().unwrap()).read_to_string(&mut output).unwrap();
        drop(out);
        let status = wait(pid);
        assert!(libc::WIFEXITED(status), "{status}");
        (libc::WEXITSTATUS(status), output)
    }

    #[test]
    fn the_child_gets_exactly_its_arguments_environment_directory_and_group() {
        let (code, output) = sh(
            r#"printf '%s|%s|%s|%s|' "$0" "$X" "$Y" "$(pwd)"; awk '{ print ($1 == $5) }' /proc/$$/stat; exit 3"#,
            &["PATH=/usr/bin:/bin", "X=a b;$(c)", "Y=first", "Y=last", "NOT_A_VARIABLE"],
            Vec::new(),
        );
        assert_eq!(code, 3);
        assert_eq!(output, "sh|a b;$(c)|last|/tmp|1\n", "argv[0] as given, the last Y, its own group");
    }

    #[test]
    fn the_child_starts_with_no_signal_blocked_sigpipe_not_ignored_and_its_limits_set() {
        let limit = libc::rlimit { rlim_cur: 77, rlim_max: 77 };
        let (code, output) = sh(
            "grep -E '^Sig(Blk|Ign)' /proc/self/status | cut -f2; ulimit -n",
            &["PATH=/usr/bin:/bin"],
            vec![(libc::RLIMIT_NOFILE, limit)],
        );
        assert_eq!(code, 0);
        let lines: Vec<&str> = output.lines().collect();
        let [blocked, ignored, files] = lines[..] else { panic!("{output}") };
        assert_eq!(u64::from_str_radix(blocked, 16), Ok(0), "blocked: {output}");
        // (this test process ignores SIGPIPE, as every Rust program does; other ignored signals
        // are inherited as std's Command leaves them)
        let ignored = u64::from_str_radix(ignored, 16).unwrap();
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored: {output}");
        assert_eq!(files, "77");
    }

    /// The errno `program` in `cwd` fails to start with, as `uid`.
    fn start_error(program: &str, cwd: &str, uid: Option<u32>) -> Option<i32> {
        let (stdin, _keep) = pipe();
        let spawn = Spawn::new(OsStr::new(program), &[], OsStr::new(cwd), &[], [stdin.as_raw_fd(); 3], uid, Vec::new());
        spawn.unwrap().start(&mut Vec::new()).unwrap_err().raw_os_error()
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error_with_its_errno() {
        assert_eq!(start_error("/nonexistent/program", "/", None), Some(libc::ENOENT));
        assert_eq!(start_error("/bin/true", "/nonexistent", None), Some(libc::ENOENT));
        assert!(
            Spawn::new(OsStr::new("/bin/true"), &["a\0b".into()], OsStr::new("/"), &[], [0; 3], None, Vec::new())
                .is_err()
        );
    }

    #[test]
    fn a_run_as_another_user_is_that_user_alone_with_no_capability_and_shares_no_dumpable_memory() {
        // SAFETY (both): getuid and prctl(PR_GET_DUMPABLE) only read this process's state.
        #[allow(unsafe_code)]
        let root = || unsafe { libc::getuid() == 0 };
        #[allow(unsafe_code)]
        let dumpable = || unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
        if !root() {
            eprintln!("skipped: changing the user needs root");
            return;
        }
        let (code, output) = sh_as(Some(65534), "id -u; id -G", &["PATH=/usr/bin:/bin"], Vec::new());
        assert_eq!((code, output.as_str()), (0, "65534\n65534\n"), "its user, its group and no other");
        // after the exec the action is that user alone, with no capability in any set, even when
        // the supervisor's thread has an inheritable and ambient one (which a saved user of root
        // would keep)
        let status = "while read -r k v; do case $k in Uid:|Gid:|CapInh:|CapPrm:|CapEff:|CapAmb:) echo $k $v;; esac; \
                      done < /proc/$$/status";
        let (raised, (code, output)) = std::thread::spawn(move || {
            let raised = raise_an_ambient_capability();
            (raised, sh_as(Some(65534), status, &[], Vec::new()))
        })
        .join()
        .unwrap();
        if !raised {
            eprintln!("not tried with an ambient capability: this host does not let root raise one");
        }
        let none = "0000000000000000";
        let expected = format!(
            "Uid: 65534 65534 65534 65534\nGid: 65534 65534 65534 65534\nCapInh: {none}\nCapPrm: {none}\nCapEff: {none}\nCapAmb: {none}\n"
        );
        assert_eq!((code, output), (0, expected));
        // (this process stands for the supervisor, whose memory the child shared until its exec)
        assert_eq!(dumpable(), 0, "the memory the child shared with its supervisor was left dumpable");
        assert_eq!(start_error("/bin/true", "/nonexistent", Some(65534)), Some(libc::ENOENT));
    }

    /// Puts CAP_NET_BIND_SERVICE in this thread's inheritable and ambient sets (root only).
    #[allow(unsafe_code)]
    fn raise_an_ambient_capability() -> bool {
        const NET_BIND_SERVICE: u32 = 10;
        let mut header = CapHeader { version: CAP_VERSION_3, pid: 0 };
        let mut data = [CapData::default(); 2];
        // SAFETY: capget and capset read and write this thread's capabilities through the two
        // local structures; prctl raises one of them in its ambient set.
        unsafe {
            if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) != 0 {
                return false;
            }
            data[0].inheritable |= 1 << NET_BIND_SERVICE;
            if libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) != 0 {
                return false;
            }
            libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, NET_BIND_SERVICE as libc::c_ulong, 0, 0) == 0
        }
    }
}
