//! The user ids process actions run as (`ATTUNE_WORKER_ACTION_UIDS`, when the worker runs as
//! root), one of its own for each running action, and what keeps one run's user from reaching a
//! later run: an action cannot read another's `/proc/<pid>` entries (environment, memory), nor
//! signal another action or the worker, and nothing it leaves behind outlives its run.
//!
//! - A user id is held with a lock file (`/run/attune-action-uids/<uid>`, `flock`) for as long as
//!   its run lasts, so that several workers on one host never share one. Ids are taken in turn
//!   through the range, from a random start.
//! - Every process of the id is killed when its run's process ends (`sweep`): a process the
//!   action left behind with `setsid` (a daemon reading the environment of its user's processes,
//!   where a later run's opened secrets are) is gone before the id runs anything else. The lock
//!   file then says `clean` until the id is taken again; an id taken without it (its last run's
//!   end was never seen: a worker killed mid-run) is swept before it is handed out. An id that
//!   some process still holds after the sweep (one stuck in the kernel, which a SIGKILL does not
//!   end at once) is not handed out: the next is taken.
//! - Each run has a private temp directory (`TEMP_BASE/<uid>-<random>`, mode 0700, the run's
//!   user's), its `TMPDIR`, `TMP`, `TEMP` and `HOME`, removed with everything in it once the
//!   run's processes are gone. The action starts with umask 077 (`supervise::spawn`).
//! - Its processes are bounded per user (`RLIMIT_NPROC`, which counts every process of the id on
//!   the host, so the run's alone: `ATTUNE_ACTION_PROCESSES`), and so is every file it writes
//!   (`RLIMIT_FSIZE`: `ATTUNE_ACTION_FILE_SIZE_MB`).
//!
//! The sweep runs as root in the worker (a process of the id can signal a helper that became
//! that user, so none does): it reads the user ids of every process in `/proc`, opens a pidfd on
//! each process of the id (so that a pid reused meanwhile is never signaled), checks the ids
//! again through it, sends SIGKILL through the pidfd, and waits on the pidfds for them to end;
//! then it looks again, for children forked before the kill landed, until a look finds none.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the lock files of the ids live (root's alone).
const LOCKS: &str = "/run/attune-action-uids";
/// Where each run's private temp directory is made: a directory of root's that others may pass
/// through but not list or write (0711), on the file system actions used for `/tmp` before.
pub const TEMP_BASE: &str = "/tmp/attune-actions";
/// What the lock file of an id holds while no process of it runs (its last run's end swept it).
const CLEAN: &[u8] = b"clean\n";
/// How long a sweep waits for the processes it killed to end, in all.
const SWEEP_PATIENCE: Duration = Duration::from_secs(5);
/// The most looks a sweep makes (each kills what it finds; a process forked before the kill
/// landed is found by the next).
const SWEEP_LOOKS: usize = 64;

/// The limits of a run of an action user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserLimits {
    /// `RLIMIT_NPROC`: the most processes (and threads) of the run's user at once.
    pub processes: u64,
    /// `RLIMIT_FSIZE`: the largest file the run may write, in bytes.
    pub file_size_bytes: u64,
}

/// The user ids of one worker's actions (see the module's comment).
#[derive(Debug)]
pub struct ActionUsers {
    range: std::ops::RangeInclusive<u32>,
    next: std::sync::atomic::AtomicU64,
    locks: PathBuf,
    temps: PathBuf,
    limits: UserLimits,
}

/// A user id taken for one run, with its private temp directory. Dropped, every process of the
/// id is killed (unless the run's end did it already), the directory removed and the id given
/// back.
pub struct ActionUser {
    pub uid: u32,
    pub temp_dir: PathBuf,
    pub limits: UserLimits,
    /// The run's end swept the id: nothing of it runs any more.
    swept: bool,
    lock: std::fs::File,
}

impl ActionUsers {
    pub fn new(range: std::ops::RangeInclusive<u32>, limits: UserLimits) -> ActionUsers {
        ActionUsers::with_dirs(range, PathBuf::from(LOCKS), PathBuf::from(TEMP_BASE), limits)
    }

    fn with_dirs(range: std::ops::RangeInclusive<u32>, locks: PathBuf, temps: PathBuf, limits: UserLimits) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        // made once; a run that finds it missing says so (`take`)
        let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&locks);
        let size = u64::from(range.end() - range.start()) + 1;
        let next = std::sync::atomic::AtomicU64::new(rand::random::<u64>() % size);
        ActionUsers { range, next, locks, temps, limits }
    }

    /// A free user id, swept, with a new private temp directory (blocking: a look through
    /// `/proc`, more when something of the id still ran). `Err` says why none can be had.
    pub fn take(&self) -> Result<ActionUser, String> {
        let (first, size) = (*self.range.start(), u64::from(self.range.end() - self.range.start()) + 1);
        for _ in 0..size.min(4096) {
            let offset = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % size;
            let uid = first + offset as u32;
            let path = self.locks.join(uid.to_string());
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| format!("cannot open the user id lock {}: {e}", path.display()))?;
            if !locked(&lock) {
                continue;
            }
            // (a run whose end was never seen, a worker killed mid-run, left it as it was)
            if !is_clean(&lock)
                && let Err(held) = sweep(uid)
            {
                tracing::warn!(uid, pids = ?held, "processes of this action user id outlived every SIGKILL (stuck \
                    in the kernel?): the id is not handed out while they hold it");
                continue;
            }
            // (in use from here: clean again once its run's end has swept it)
            lock.set_len(0).map_err(|e| format!("cannot mark the user id lock {}: {e}", path.display()))?;
            let temp_dir = private_dir(&self.temps, uid)?;
            return Ok(ActionUser { uid, temp_dir, limits: self.limits, swept: false, lock });
        }
        Err("no user id of ATTUNE_WORKER_ACTION_UIDS is free (each is held by a running action, or by \
             processes that outlived their run)"
            .into())
    }
}

impl ActionUser {
    /// Kills every process of the id, at the end of its run's process (blocking); remembered, so
    /// that the drop need not look again.
    pub fn sweep(&mut self) {
        match sweep(self.uid) {
            Ok(()) => self.swept = true,
            Err(held) => tracing::warn!(uid = self.uid, pids = ?held,
                "processes of this action user id outlived every SIGKILL at the end of its run"),
        }
    }

    /// Whether nothing of the id runs any more (`no_process_is_really`), remembered as a sweep:
    /// the usual end of a run, answered by one system call without leaving the caller's thread.
    pub fn nothing_left(&mut self) -> bool {
        self.swept = self.swept || no_process_is_really(self.uid);
        self.swept
    }
}

impl Drop for ActionUser {
    fn drop(&mut self) {
        if !self.swept {
            self.sweep();
        }
        // (after the sweep: nothing of the run's user can plant anything in it meanwhile)
        if let Err(e) = std::fs::remove_dir_all(&self.temp_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(uid = self.uid, dir = %self.temp_dir.display(), error = %e,
                "could not remove a run's private temp directory");
        }
        if self.swept {
            use std::os::unix::fs::FileExt;
            // (not written whole, it is not `clean`: the next taker sweeps)
            let _ = self.lock.write_all_at(CLEAN, 0);
        }
    }
}

/// Whether the lock file says that no process of its id runs.
fn is_clean(lock: &std::fs::File) -> bool {
    use std::os::unix::fs::FileExt;
    let mut read = [0u8; 8];
    lock.read_at(&mut read, 0).is_ok_and(|n| &read[..n] == CLEAN)
}

/// Takes an exclusive `flock` on `file` without waiting; `false` if another holds it.
#[allow(unsafe_code)]
fn locked(file: &std::fs::File) -> bool {
    // SAFETY: flock on a file descriptor this function borrows; it has no memory effects
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Makes `uid`'s private temp directory of a run under `base` (made first if missing: root's,
/// 0711, refused if anyone else could have made or changed it).
fn private_dir(base: &Path, uid: u32) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let refused = |why: String| format!("cannot make the run's private temp directory under {}: {why}", base.display());
    match std::fs::DirBuilder::new().mode(0o711).create(base) {
        Ok(()) => std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| refused(e.to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refused(e.to_string())),
    }
    // (in a directory others may write, such as /tmp, another user could have made it first)
    let meta = std::fs::symlink_metadata(base).map_err(|e| refused(e.to_string()))?;
    if !meta.is_dir() || meta.uid() != effective_uid() || meta.mode() & 0o022 != 0 {
        return Err(refused(format!(
            "it is not a directory of the worker's own user that no one else may write (owner {}, mode {:o}): \
             remove it",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let dir = base.join(format!("{uid}-{:016x}", rand::random::<u64>()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| refused(e.to_string()))?;
    if let Err(e) = std::os::unix::fs::lchown(&dir, Some(uid), Some(uid)) {
        let _ = std::fs::remove_dir(&dir);
        return Err(refused(e.to_string()));
    }
    Ok(dir)
}

#[allow(unsafe_code)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail
    unsafe { libc::geteuid() }
}

/// Kills every process that `uid` holds (its real, effective, saved or file system user), until
/// a look through `/proc` finds none alive: `Err` with those still there after `SWEEP_LOOKS`
/// looks or `SWEEP_PATIENCE`. Blocking; to be called as root. A zombie holds nothing (it runs
/// no more and is its parent's to reap), and is not waited for.
pub fn sweep(uid: u32) -> Result<(), Vec<i32>> {
    // (the common end of a run: nothing was left behind, and one system call says so)
    if no_process_is_really(uid) {
        return Ok(());
    }
    let deadline = Instant::now() + SWEEP_PATIENCE;
    let mut held = Vec::new();
    for _ in 0..SWEEP_LOOKS {
        held = holders(uid);
        let mut dying = Vec::new();
        for pid in held.iter().copied() {
            match Pidfd::open(pid) {
                Ok(pidfd) => {
                    // (the pid could have been another process's before the pidfd pinned it)
                    if pidfd.exited() || !holder_of(pid, uid) {
                        continue;
                    }
                    pidfd.kill();
                    dying.push(pidfd);
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                // (a kernel without pidfds, before 5.3: by pid, once more checked)
                Err(_) => {
                    if holder_of(pid, uid) && !zombie(pid) {
                        kill_pid(pid);
                        dying.push(Pidfd(None));
                    }
                }
            }
        }
        if dying.is_empty() {
            return Ok(());
        }
        if !Pidfd::wait_all(&dying, deadline) {
            break;
        }
    }
    held.retain(|pid| holder_of(*pid, uid) && !zombie(*pid));
    if held.is_empty() { Ok(()) } else { Err(held) }
}

/// Whether no process (nor thread, nor zombie) has `uid` as its real user id: `getpriority(2)` of
/// `PRIO_USER`, which the kernel answers by looking at every thread and fails with `ESRCH` when
/// none is the user's. One system call, where a look through `/proc` reads every process's
/// `status` (1.5 to 1.8 ms with about 100 processes). Every process of a run keeps the run's
/// user as its real, effective and saved one: its start sets `PR_SET_NO_NEW_PRIVS`
/// (`supervise::spawn`), so no set-user-id file nor file capability it execs changes its ids, and
/// a process may only move among the ids it has. What it does not see is another user's process
/// that took `uid` as its effective id alone by running a set-user-id file of `uid`'s left
/// outside the run's temp directory; such a process could appear after any look.
#[allow(unsafe_code)]
fn no_process_is_really(uid: u32) -> bool {
    // (0 would ask of the caller's own user)
    if uid == 0 {
        return false;
    }
    // SAFETY: getpriority has no memory effects; the raw call returns 20 - nice (1 to 40) for a
    // user with a process, so -1 is only ever its failure
    let answer = unsafe { libc::syscall(libc::SYS_getpriority, libc::PRIO_USER as libc::c_long, uid as libc::c_long) };
    answer == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// The processes whose real, effective, saved or file system user id is `uid`, zombies among
/// them.
fn holders(uid: u32) -> Vec<i32> {
    let mut pids = Vec::new();
    let mut text = String::with_capacity(2048);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        text.clear();
        let Ok(mut file) = std::fs::File::open(format!("/proc/{pid}/status")) else { continue };
        if std::io::Read::read_to_string(&mut file, &mut text).is_ok() && status_holds(&text, uid) {
            pids.push(pid);
        }
    }
    pids
}

fn holder_of(pid: i32, uid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| status_holds(&status, uid))
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|status| status.lines().any(|line| line.starts_with("State:") && line.contains('Z')))
}

/// Whether a `/proc/<pid>/status` text names `uid` among its `Uid:` ids (real, effective, saved,
/// file system).
fn status_holds(status: &str, uid: u32) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .is_some_and(|ids| ids.split_whitespace().any(|id| id.parse::<u32>() == Ok(uid)))
}

#[allow(unsafe_code)]
fn kill_pid(pid: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid was checked to be the user's
    // just before (the small window of a reuse is the price of a kernel without pidfds)
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// A pidfd on a process (`None` where the kernel has none).
struct Pidfd(Option<OwnedFd>);

impl Pidfd {
    #[allow(unsafe_code)]
    fn open(pid: i32) -> std::io::Result<Pidfd> {
        // SAFETY: pidfd_open returns a new descriptor (owned once here) or -1
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just returned to this process, and nothing else owns it
        Ok(Pidfd(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })))
    }

    /// Whether its process has ended (its whole thread group: a leader that exited while its
    /// other threads run on is not).
    fn exited(&self) -> bool {
        self.0.as_ref().is_none_or(|fd| poll_in(&[fd.as_raw_fd()], 0) > 0)
    }

    #[allow(unsafe_code)]
    fn kill(&self) {
        let Some(fd) = &self.0 else { return };
        // SAFETY: pidfd_send_signal on a descriptor this value owns, with no siginfo
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd() as libc::c_long,
                libc::SIGKILL as libc::c_long,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_long,
            );
        }
    }

    /// Waits until every one of `pidfds` has ended, or `deadline`; whether they all did (those
    /// without a pidfd are given 10 ms).
    fn wait_all(pidfds: &[Pidfd], deadline: Instant) -> bool {
        let mut waiting: Vec<i32> = pidfds.iter().filter_map(|p| p.0.as_ref().map(AsRawFd::as_raw_fd)).collect();
        if waiting.len() < pidfds.len() {
            std::thread::sleep(Duration::from_millis(10));
        }
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let millis = left.as_millis().min(1000) as i32;
            if poll_in(&waiting, millis) > 0 {
                waiting.retain(|fd| poll_in(&[*fd], 0) == 0);
            }
        }
        true
    }
}

/// `poll` for input on `fds`; how many have it.
#[allow(unsafe_code)]
fn poll_in(fds: &[i32], timeout_millis: i32) -> i32 {
    let mut polled: Vec<libc::pollfd> =
        fds.iter().map(|fd| libc::pollfd { fd: *fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: poll reads and writes the local array of pollfds, of the length given
    unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout_millis) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: UserLimits = UserLimits { processes: 64, file_size_bytes: 1 << 20 };

    fn scratch(what: &str) -> PathBuf {
        std::env::temp_dir().join(format!("attune-{what}-{:016x}", rand::random::<u64>()))
    }

    #[test]
    fn a_user_id_is_held_by_one_run_at_a_time_across_workers() {
        if effective_uid() != 0 {
            eprintln!("skipped: a run's temp directory is given to its user, which needs root");
            return;
        }
        let (locks, temps) = (scratch("uids"), scratch("temps"));
        // two workers of one host, a range of three ids
        let users = || ActionUsers::with_dirs(70..=72, locks.clone(), temps.clone(), LIMITS);
        let (a, b) = (users(), users());
        let taken = [a.take().unwrap(), b.take().unwrap(), a.take().unwrap()];
        let mut uids: Vec<u32> = taken.iter().map(|u| u.uid).collect();
        uids.sort();
        assert_eq!(uids, [70, 71, 72], "three runs, three ids");
        assert!(b.take().is_err(), "a fourth waits for one to end");
        drop(taken);
        let again = b.take().unwrap();
        assert!((70..=72).contains(&again.uid));
        drop(again);
        std::fs::remove_dir_all(locks).unwrap();
        std::fs::remove_dir_all(temps).unwrap();
    }

    #[test]
    fn a_runs_temp_directory_is_its_users_alone_and_goes_with_it() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if effective_uid() != 0 {
            eprintln!("skipped: a run's temp directory is given to its user, which needs root");
            return;
        }
        let (locks, temps) = (scratch("uids"), scratch("temps"));
        // (two ids: a lock file's descriptor is shared for a moment with a child another test
        // forks before it execs, and a single id would then read as held)
        let users = ActionUsers::with_dirs(73..=74, locks.clone(), temps.clone(), LIMITS);
        let user = users.take().unwrap();
        let meta = std::fs::metadata(&user.temp_dir).unwrap();
        assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (user.uid, user.uid, 0o700));
        assert_eq!(std::fs::metadata(&temps).unwrap().mode() & 0o7777, 0o711, "others pass, never list");
        std::fs::create_dir_all(user.temp_dir.join("deep/er")).unwrap();
        std::fs::write(user.temp_dir.join("deep/er/file"), "left").unwrap();
        let dir = user.temp_dir.clone();
        drop(user);
        assert!(!dir.exists(), "{} outlived its run", dir.display());
        // a base another user could have made is refused
        std::fs::set_permissions(&temps, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = users.take().err().unwrap();
        assert!(error.contains(temps.to_str().unwrap()) && error.contains("remove it"), "{error}");
        std::fs::remove_dir_all(locks).unwrap();
        std::fs::remove_dir_all(temps).unwrap();
    }

    #[test]
    fn an_id_whose_last_end_was_not_seen_is_swept_before_it_is_handed_out() {
        use std::os::unix::process::CommandExt;
        if effective_uid() != 0 {
            eprintln!("skipped: running as another user needs root");
            return;
        }
        let (locks, temps) = (scratch("uids"), scratch("temps"));
        // a process of the id, as a run whose end was never seen (its worker killed) left it: its
        // lock file does not say `clean` (here there is none yet)
        let mut left = std::process::Command::new("setsid").args(["sleep", "60"]).uid(75).gid(75).spawn().unwrap();
        let users = ActionUsers::with_dirs(75..=75, locks.clone(), temps.clone(), LIMITS);
        let user = users.take().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(left.wait().unwrap().signal(), Some(libc::SIGKILL), "what the lost run left was killed");
        drop(user);
        let lock = std::fs::File::open(locks.join("75")).unwrap();
        assert!(is_clean(&lock), "its end swept it");
        std::fs::remove_dir_all(locks).unwrap();
        std::fs::remove_dir_all(temps).unwrap();
    }

    #[test]
    fn the_status_ids_name_their_user_whichever_they_are() {
        let status = |ids: &str| format!("Name:\tsh\nState:\tS (sleeping)\nUid:\t{ids}\nGid:\t5\t5\t5\t5\n");
        assert!(status_holds(&status("70\t70\t70\t70"), 70));
        assert!(status_holds(&status("70\t0\t0\t0"), 70), "a setuid program it ran");
        assert!(status_holds(&status("0\t0\t70\t0"), 70));
        assert!(!status_holds(&status("700\t7000\t7\t0"), 70));
        assert!(!status_holds("Name:\tsh\n", 70));
    }

    #[test]
    fn a_sweep_kills_what_left_its_group_and_what_it_forks() {
        use std::os::unix::process::CommandExt;
        if effective_uid() != 0 {
            eprintln!("skipped: running as another user needs root");
            return;
        }
        let uid = 76; // no other test of this module uses it (each test has its ids of its own)
        // a daemon in a session of its own that keeps forking children, and one that ignores
        // every signal it can
        let mut daemons = Vec::new();
        for script in ["while :; do sleep 30 & sleep 0.01; done", "trap '' TERM INT HUP QUIT; sleep 30"] {
            let child = std::process::Command::new("setsid")
                .args(["sh", "-c", script])
                .uid(uid)
                .gid(uid)
                .current_dir("/")
                .spawn()
                .unwrap();
            daemons.push(child);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while holders(uid).len() < 4 {
            assert!(Instant::now() < deadline, "the daemons did not start");
            std::thread::yield_now();
        }
        let started = Instant::now();
        assert_eq!(sweep(uid), Ok(()));
        let took = started.elapsed();
        for mut daemon in daemons {
            daemon.wait().unwrap();
        }
        let left: Vec<i32> = holders(uid).into_iter().filter(|pid| !zombie(*pid)).collect();
        assert!(left.is_empty(), "{left:?} outlived the sweep");
        eprintln!("swept in {took:?}");
        // nothing to kill: one look
        let started = Instant::now();
        assert_eq!(sweep(uid), Ok(()));
        eprintln!("a sweep of a user with no process: {:?}", started.elapsed());
    }

    #[test]
    fn one_system_call_says_whether_a_user_has_any_process_left() {
        use std::os::unix::process::CommandExt;
        if effective_uid() != 0 {
            eprintln!("skipped: running as another user needs root");
            return;
        }
        let uid = 77; // no other test of this module uses it
        assert!(no_process_is_really(uid), "nothing runs as {uid} yet");
        assert!(!no_process_is_really(0), "0 is never asked of");
        // left behind in a session of its own, as a daemon an action started would be
        let mut left = std::process::Command::new("setsid").args(["sleep", "60"]).uid(uid).gid(uid).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while holders(uid).is_empty() {
            assert!(Instant::now() < deadline, "the process did not start");
            std::thread::yield_now();
        }
        assert!(!no_process_is_really(uid), "a process of {uid} runs");
        assert_eq!(sweep(uid), Ok(()));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(left.wait().unwrap().signal(), Some(libc::SIGKILL), "the sweep did not stop at the quick look");
        assert!(no_process_is_really(uid), "it was reaped: nothing of {uid} is left");
    }
}
