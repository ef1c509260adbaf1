//! The supervisor's starters: threads that start actions (`spawn`) off its loop. A start's clone
//! suspends the thread that made it until the child has exec'd (`CLONE_VFORK`), and an exec, or
//! the child's `chdir`, can wait without end on a stalled file system (a packs mount whose server
//! went away, an interpreter on a hung NFS share). Made on the loop, such a start would stop every
//! other run's limits, its lease and its reports with it; made here, it holds one starter, and
//! the loop goes on.
//!
//! A starter lives as long as the supervisor: `PR_SET_PDEATHSIG` is tied to the thread that made
//! the child, and a starter that ended would kill every action it had started. So there are as
//! many starters as starts were ever in flight at once (most often one), at most `MOST`; past
//! that a start waits for a starter to be free. Each one takes the next request from the queue,
//! starts it, and hands its outcome to the loop, which it wakes through an `eventfd`.
//!
//! Every child is reaped by the loop (`server::Supervisor::reap`), the ones that failed before
//! their exec too: a starter reaps nothing, so that no two threads race for the same zombie. A
//! child may end before its starter's outcome reaches the loop; the loop keeps its status until
//! then (`server::Supervisor::unclaimed`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::protocol::SpawnRequest;
use super::spawn;

/// The most starters: that many starts stuck at once leave the next ones waiting.
const MOST: usize = 16;

/// A start to make.
pub(super) struct Job {
    pub(super) id: u64,
    pub(super) request: SpawnRequest,
    pub(super) stdio: [OwnedFd; 3],
    pub(super) rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The child's pid once it exists (0 before), for the loop to kill a start that waits.
    pub(super) pid: Arc<AtomicI32>,
    /// Set by the loop when the start is to be killed before it comes (given up by the worker,
    /// the lease's end): a job still queued behind busy starters is then not started at all.
    pub(super) cancelled: Arc<AtomicBool>,
}

/// What a start came to.
pub(super) struct Outcome {
    pub(super) id: u64,
    /// The child made, if one was (reaped by the loop, whatever became of it).
    pub(super) child: Option<libc::pid_t>,
    /// Its pid once it exec'd, or why it did not.
    pub(super) started: std::io::Result<libc::pid_t>,
}

pub(super) struct Starters {
    jobs: mpsc::Sender<Job>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    /// Written by a starter when an outcome is ready; the loop polls it.
    wake: Arc<OwnedFd>,
    threads: usize,
    /// Starts handed over whose outcome the loop has not taken.
    in_flight: usize,
}

impl Starters {
    #[allow(unsafe_code)]
    pub(super) fn new() -> std::io::Result<Starters> {
        // SAFETY: eventfd returns a new descriptor, owned once here.
        let wake = unsafe {
            let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let (jobs, queue) = mpsc::channel();
        Ok(Starters {
            jobs,
            queue: Arc::new(Mutex::new(queue)),
            outcomes: Arc::new(Mutex::new(Vec::new())),
            wake: Arc::new(wake),
            threads: 0,
            in_flight: 0,
        })
    }

    /// The descriptor that is readable when outcomes wait.
    pub(super) fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Hands `job` to a free starter (a new one if every one is busy, up to `MOST`).
    pub(super) fn start(&mut self, job: Job) -> std::io::Result<()> {
        if self.in_flight >= self.threads && self.threads < MOST {
            let (queue, outcomes, wake) = (self.queue.clone(), self.outcomes.clone(), self.wake.clone());
            std::thread::Builder::new()
                .name(format!("starter-{}", self.threads))
                .spawn(move || serve(&queue, &outcomes, &wake))?;
            self.threads += 1;
        }
        self.jobs.send(job).map_err(|_| std::io::Error::other("the starters are gone"))?;
        self.in_flight += 1;
        Ok(())
    }

    /// The outcomes ready now.
    #[allow(unsafe_code)]
    pub(super) fn take(&mut self) -> Vec<Outcome> {
        let mut count = 0u64;
        // SAFETY: reads the eventfd's 8-byte counter into a local (clearing it).
        unsafe { libc::read(self.wake.as_raw_fd(), &mut count as *mut u64 as *mut libc::c_void, 8) };
        let taken = std::mem::take(&mut *self.outcomes.lock().unwrap_or_else(|e| e.into_inner()));
        self.in_flight -= taken.len().min(self.in_flight);
        taken
    }
}

/// A starter: takes each job in turn, for as long as the supervisor lives.
#[allow(unsafe_code)]
fn serve(queue: &Mutex<mpsc::Receiver<Job>>, outcomes: &Mutex<Vec<Outcome>>, wake: &OwnedFd) {
    let mut stack = Vec::new();
    loop {
        let job = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(job) = job else { return };
        let outcome = start(job, &mut stack);
        outcomes.lock().unwrap_or_else(|e| e.into_inner()).push(outcome);
        let one = 1u64;
        // SAFETY: adds one to the eventfd's counter from a local.
        unsafe { libc::write(wake.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }
}

fn start(job: Job, stack: &mut Vec<u8>) -> Outcome {
    let Job { id, request, stdio, rlimits, pid, cancelled } = job;
    if cancelled.load(Ordering::SeqCst) {
        let error = std::io::Error::new(std::io::ErrorKind::Interrupted, "given up before it was started");
        return Outcome { id, child: None, started: Err(error) };
    }
    let prepared = spawn::Spawn::new(
        &request.program,
        &request.args,
        &request.cwd,
        &request.env,
        [stdio[0].as_raw_fd(), stdio[1].as_raw_fd(), stdio[2].as_raw_fd()],
        request.uid,
        rlimits,
    );
    let outcome = match prepared.and_then(|spawn| spawn.clone_child(stack, &pid)) {
        Ok((pid, 0)) => Outcome { id, child: Some(pid), started: Ok(pid) },
        Ok((pid, errno)) => Outcome { id, child: Some(pid), started: Err(std::io::Error::from_raw_os_error(errno)) },
        Err(e) => Outcome { id, child: None, started: Err(e) },
    };
    // (the child has its own copies of the pipe ends; the supervisor's close here)
    drop(stdio);
    outcome
}
