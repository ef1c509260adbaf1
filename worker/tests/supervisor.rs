//! The worker's long-lived supervisor (`attune_worker::supervise`), with the real binary: many
//! actions run at once through one supervisor process, a timeout kills a whole group through it,
//! and a supervisor that is killed fails its runs, leaves none of their processes behind, and is
//! replaced for the next run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use attune_core::FailureKind;
use attune_worker::destination::AllowList;
use attune_worker::runner::{ActionRun, Finished, Runtimes, classify};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);

fn temp_pack(script: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attune-supervisor-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.sh"), script).unwrap();
    dir
}

fn run_of<'a>(dir: &Path, parameters: &'a Value, timeout: Duration) -> ActionRun<'a> {
    ActionRun {
        execution_id: 7,
        action_ref: "test.run",
        runtime: "shell",
        pack_path: dir.to_path_buf(),
        entrypoint: "run.sh",
        parameters,
        timeout,
        retry_count: 0,
        output_limit: 65536,
        transient_exit_codes: &[],
        http: None,
        idempotency_key: "key-7",
        limits: None,
        kill: None,
        traceparent: None,
        capture: None,
    }
}

async fn supervised() -> Runtimes {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_attune-worker"));
    Runtimes::detect(&["shell".into()], Some(binary), AllowList::default()).await
}

/// Waits until `condition` holds, failing after `DEADLINE`.
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a process is gone (or a zombie waiting for its parent).
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z"))
}

fn pid_in(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_actions_run_at_once_through_one_supervisor() {
    let runtimes = supervised().await;
    let supervisor = runtimes.supervisor_pid().expect("the supervisor starts with the runtimes");
    // each prints its parameter and its parent, and stays until all have started
    let dir = temp_pack(
        "echo \"$ATTUNE_PARAM_N $PPID\"\ntouch started-$ATTUNE_PARAM_N\nwhile [ $(ls | grep -c started-) -lt 40 ]; do sleep 0.05; done\n",
    );
    let parameters: Vec<Value> = (0..40).map(|n| json!({ "n": n })).collect();
    let runs = parameters.iter().map(|p| run_of(&dir, p, Duration::from_secs(30))).collect::<Vec<_>>();
    let token = CancellationToken::new();
    let ran = futures_util::future::join_all(runs.iter().map(|run| runtimes.execute(run, &token))).await;
    for (n, ran) in ran.iter().enumerate() {
        assert_eq!(ran.outcome.failure_kind, None, "{ran:?}");
        assert_eq!(ran.stdout, format!("{n} {supervisor}\n"), "run {n} was started by the one supervisor");
    }
    assert_eq!(runtimes.supervisor_pid(), Some(supervisor));
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_kills_the_whole_group_through_the_supervisor() {
    let runtimes = supervised().await;
    let dir = temp_pack("sleep 30 &\necho $! > child.pid\nsleep 30\n");
    let parameters = json!({});
    let started = Instant::now();
    let finished =
        runtimes.run(&run_of(&dir, &parameters, Duration::from_millis(300)), &CancellationToken::new()).await;
    assert!(finished.timed_out, "{finished:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let grandchild = pid_in(&dir.join("child.pid")).unwrap();
    wait_until("the background grandchild to be killed", || gone(grandchild)).await;
    assert_eq!(classify(&finished, &[]).failure_kind, Some(FailureKind::Timeout));
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_gives_the_action_its_sigterm_with_no_signal_blocked() {
    // the supervisor blocks signals it waits for; its actions must start with none blocked, or
    // a timeout's SIGTERM would wait unseen until the SIGKILL after the grace
    let runtimes = supervised().await;
    let dir = temp_pack("grep '^SigBlk' /proc/self/status\ntrap 'echo bye; exit 0' TERM\nsleep 30 &\nwait\n");
    let parameters = json!({});
    let finished =
        runtimes.run(&run_of(&dir, &parameters, Duration::from_millis(500)), &CancellationToken::new()).await;
    assert!(finished.timed_out, "{finished:?}");
    assert!(finished.stdout.contains("SigBlk:\t0000000000000000"), "signals blocked in the action: {finished:?}");
    assert!(finished.stdout.contains("bye"), "the action's TERM trap did not run: {finished:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_fails_its_runs_and_a_new_one_serves_the_next() {
    let runtimes = supervised().await;
    let first = runtimes.supervisor_pid().expect("the supervisor starts with the runtimes");
    let dir = temp_pack("sleep 60 &\necho $! > child.pid\necho $$ > action.pid\nsleep 60\n");
    let parameters = json!({});
    let run = run_of(&dir, &parameters, Duration::from_secs(120));
    let token = CancellationToken::new();
    let running = runtimes.run(&run, &token);
    let kill = async {
        wait_until("the action and its grandchild to start", || {
            pid_in(&dir.join("child.pid")).is_some() && pid_in(&dir.join("action.pid")).is_some()
        })
        .await;
        let status = std::process::Command::new("kill").args(["-9", &first.to_string()]).status().unwrap();
        assert!(status.success());
    };
    let (finished, ()): (Finished, ()) = tokio::join!(running, kill);
    assert_eq!(finished.signal, Some(9), "{finished:?}");
    assert!(finished.stderr.contains("supervisor was lost"), "{finished:?}");
    // the platform's loss, not the action's failure (issue 46)
    assert_eq!(classify(&finished, &[]).failure_kind, Some(FailureKind::WorkerUnavailable));
    for pid in [pid_in(&dir.join("action.pid")).unwrap(), pid_in(&dir.join("child.pid")).unwrap()] {
        wait_until("the action's processes to be killed", || gone(pid)).await;
    }

    let next = temp_pack("echo again\n");
    let ran = runtimes.execute(&run_of(&next, &parameters, Duration::from_secs(10)), &token).await;
    assert_eq!((ran.outcome.failure_kind, ran.stdout.as_str()), (None, "again\n"), "{ran:?}");
    let second = runtimes.supervisor_pid().expect("a new supervisor");
    assert_ne!(second, first);
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(next).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_that_stops_answering_is_killed_and_replaced() {
    let runtimes = supervised().await;
    let first = runtimes.supervisor_pid().expect("the supervisor starts with the runtimes");
    // alive, its socket open, answering nothing, not even a ping (a stopped process)
    let status = std::process::Command::new("kill").args(["-STOP", &first.to_string()]).status().unwrap();
    assert!(status.success());
    let dir = temp_pack("echo never\n");
    let parameters = json!({});
    let token = CancellationToken::new();
    let started = Instant::now();
    let finished = runtimes.run(&run_of(&dir, &parameters, Duration::from_secs(60)), &token).await;
    assert_eq!(finished.signal, Some(9), "{finished:?}");
    assert!(finished.stderr.contains("supervisor was lost"), "{finished:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "waited {:?} on a stopped supervisor", started.elapsed());
    wait_until("the stopped supervisor to be killed", || gone(first as i32)).await;

    let ran = runtimes.execute(&run_of(&dir, &parameters, Duration::from_secs(10)), &token).await;
    assert_eq!((ran.outcome.failure_kind, ran.stdout.as_str()), (None, "never\n"), "{ran:?}");
    assert_ne!(runtimes.supervisor_pid().expect("a new supervisor"), first);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_cannot_start_is_the_workers_failure_and_the_supervisor_stays() {
    let runtimes = supervised().await;
    let supervisor = runtimes.supervisor_pid().unwrap();
    let dir = temp_pack("echo never\n");
    let parameters = json!({"message": "x".repeat(200 * 1024)});
    let ran = runtimes.execute(&run_of(&dir, &parameters, Duration::from_secs(10)), &CancellationToken::new()).await;
    // one environment variable above 128 KiB: the kernel refuses the exec (E2BIG)
    assert_eq!(ran.outcome.failure_kind, Some(FailureKind::InvalidParameters), "{ran:?}");
    assert_eq!(runtimes.supervisor_pid(), Some(supervisor));
    let small = json!({"message": "y".repeat(60 * 1024)});
    let ran = runtimes.execute(&run_of(&dir, &small, Duration::from_secs(10)), &CancellationToken::new()).await;
    assert_eq!(
        (ran.outcome.failure_kind, ran.stdout.as_str()),
        (None, "never\n"),
        "a request of several parts: {ran:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The supervisor's CPU time per running action per minute, for actions that sleep (`cargo test
/// -p attune-worker --release --test supervisor -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of about a minute"]
async fn measure_the_supervisors_cpu_per_sleeping_action() {
    const ACTIONS: usize = 20;
    let runtimes = supervised().await;
    let supervisor = runtimes.supervisor_pid().unwrap();
    let dir = temp_pack("sleep 70\n");
    let parameters = json!({});
    let runs: Vec<_> = (0..ACTIONS).map(|_| run_of(&dir, &parameters, Duration::from_secs(120))).collect();
    let token = CancellationToken::new();
    let cpu_ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{supervisor}/stat")).unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let measure = async {
        // the first 10 s (looks every 50 ms for 2 s, then less often), then 50 s of steady state
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (young, at) = (cpu_ticks(), Instant::now());
        tokio::time::sleep(Duration::from_secs(50)).await;
        let (old, secs) = (cpu_ticks(), at.elapsed().as_secs_f64());
        (young, old - young, secs)
    };
    let (_, (young, steady, secs)) =
        tokio::join!(futures_util::future::join_all(runs.iter().map(|run| runtimes.run(run, &token))), async {
            let measured = measure.await;
            token.cancel();
            measured
        });
    let per_action_minute = steady as f64 / 100.0 / ACTIONS as f64 * 60.0 / secs;
    eprintln!(
        "supervisor of {ACTIONS} sleeping actions: {young} ticks in the first 10 s, {steady} ticks in {secs:.1} s \
         after: {per_action_minute:.4} s of CPU per running action per minute"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// CPU time of this process and of its reaped children (user + system), in seconds.
#[allow(unsafe_code)]
fn rusage_secs(who: i32) -> f64 {
    // SAFETY: getrusage writes into a local struct.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// A process's own CPU time and its reaped children's, in seconds, from `/proc/<pid>/stat`.
fn process_secs(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    let ticks = |range: std::ops::Range<usize>| {
        fields[range].iter().map(|f| f.parse::<u64>().unwrap()).sum::<u64>() as f64 / 100.0
    };
    (ticks(11..13), ticks(13..15))
}

/// All the CPU one `core.echo` run costs on this side of the broker (the worker's running of it,
/// its supervisor, the action's own processes), through the long-lived supervisor and through a
/// supervisor per action, and without a supervisor (the action started by this process), one
/// after the other (`cargo test -p attune-worker --release --test
/// supervisor measure_the_cpu -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement"]
async fn measure_the_cpu_of_an_echo_run_with_each_supervisor() {
    const RUNS: usize = 2000;
    const AT_ONCE: usize = 8;
    let echo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    let parameters = json!({"message": "hi"});
    let token = CancellationToken::new();
    for mode in ["one long-lived supervisor", "a supervisor per action", "no supervisor"].repeat(2) {
        let runtimes = match mode {
            "a supervisor per action" => supervised().await.with_per_action_supervisors(),
            "no supervisor" => Runtimes::detect(&["shell".into()], None, AllowList::default()).await,
            _ => supervised().await,
        };
        let shared = runtimes.supervisor_pid();
        let before = rusage_secs(libc::RUSAGE_SELF) + rusage_secs(libc::RUSAGE_CHILDREN);
        let shared_before = shared.map_or((0.0, 0.0), process_secs);
        let started = Instant::now();
        let run = ActionRun { entrypoint: "actions/echo.sh", ..run_of(&echo, &parameters, Duration::from_secs(30)) };
        let next = std::sync::atomic::AtomicUsize::new(0);
        let lane = || async {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < RUNS {
                let ran = runtimes.execute(&run, &token).await;
                assert_eq!(ran.outcome.failure_kind, None, "{ran:?}");
            }
        };
        futures_util::future::join_all((0..AT_ONCE).map(|_| lane())).await;
        let wall = started.elapsed().as_secs_f64();
        let worker = rusage_secs(libc::RUSAGE_SELF) + rusage_secs(libc::RUSAGE_CHILDREN) - before;
        let shared_after = shared.map_or((0.0, 0.0), process_secs);
        let (supervisor, actions) = (shared_after.0 - shared_before.0, shared_after.1 - shared_before.1);
        let per_run = |secs: f64| secs * 1e3 / RUNS as f64;
        eprintln!(
            "{}: {RUNS} echo runs, {AT_ONCE} at once: {:.0}/s, {:.2} ms of CPU per run (this process and its \
             reaped children {:.2} ms; the long-lived supervisor itself {:.2} ms, its actions {:.2} ms)",
            mode,
            RUNS as f64 / wall,
            per_run(worker + supervisor + actions),
            per_run(worker),
            per_run(supervisor),
            per_run(actions),
        );
    }
}

/// A supervisor that finds a tracer left attached when it makes itself not dumpable (strace or gdb
/// following the worker's children) refuses to start: the requests it holds carry secrets.
#[test]
#[allow(unsafe_code)]
// (the child is reaped by `waitpid`, which its tracer must call to see it stop and go on)
#[allow(clippy::zombie_processes)]
fn a_supervisor_started_under_a_tracer_refuses_to_start() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let socket = theirs.as_raw_fd();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_attune-worker"));
    command
        .args(["supervisor", &std::process::id().to_string(), &socket.to_string()])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec, the child clears close-on-exec on its copy of the socket and
    // asks to be traced by this process; both are system calls on its own state.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(socket, libc::F_SETFD, 0) != 0
                || libc::ptrace(libc::PTRACE_TRACEME, 0, std::ptr::null_mut::<libc::c_void>(), 0) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) => {
            eprintln!("skipped: this host does not let a process be traced ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr.take().unwrap();
    // the traced child stops at its exec, and at any signal: each time it is let go on, traced
    let deadline = Instant::now() + DEADLINE;
    let code = loop {
        assert!(Instant::now() < deadline, "the traced supervisor went on running");
        let mut status = 0;
        // SAFETY: reaps or observes this test's own child, without blocking.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(waited >= 0, "{}", std::io::Error::last_os_error());
        if waited == 0 {
            std::thread::sleep(Duration::from_millis(10));
        } else if libc::WIFSTOPPED(status) {
            let signal = match libc::WSTOPSIG(status) {
                libc::SIGTRAP => 0,
                other => other,
            };
            // SAFETY: resumes this test's own stopped tracee.
            unsafe { libc::ptrace(libc::PTRACE_CONT, pid, std::ptr::null_mut::<libc::c_void>(), signal) };
        } else if libc::WIFEXITED(status) {
            break libc::WEXITSTATUS(status);
        } else {
            panic!("the traced supervisor ended otherwise: {status:#x}");
        }
    };
    let mut said = String::new();
    stderr.read_to_string(&mut said).unwrap();
    assert_eq!(code, 2, "{said}");
    // (a tracer is a thread: the one of this test that started the child)
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) };
    assert!(said.contains(&format!("traced by process {me}")), "{said}");
    drop((ours, theirs));
}
