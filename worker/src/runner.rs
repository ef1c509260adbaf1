//! Running one action: a child process in its own process group, parameters passed as data
//! (environment variables and JSON on stdin, never a shell line), stdout and stderr drained
//! concurrently into bounded buffers, and the timeout raced against the exit (SIGTERM to the
//! group, then SIGKILL after a grace period). `builtin` and `http` actions run inside the worker
//! (`crate::http` makes an http action's request); `Runtimes::execute` runs any of them and
//! reports a `Ran`.
//!
//! Script contract: parameter `foo_bar` arrives as `ATTUNE_PARAM_FOO_BAR` (strings as is, other
//! types as JSON) and all parameters as one JSON object on stdin; `ATTUNE_IDEMPOTENCY_KEY` is
//! the same for every attempt of a retry chain (to tell a retry from a new request). If the last non-empty line of
//! stdout is a JSON object, it is the execution's `result`. Exit code 0 is success; exit code 75
//! (EX_TEMPFAIL), or a result containing `{"attune": {"transient": true}}`, reports a transient
//! failure that the retry policy may retry; 65 (EX_DATAERR) is `validation_error` and 77
//! (EX_NOPERM) `permission_denied`, neither retried; any other exit code is `action_failed`.
//!
//! With a supervisor (the worker's own binary, `crate::supervise`), the action is started by the
//! worker's one long-lived supervisor process, which holds its group to its limits and takes it
//! down if the worker dies (`run_supervised`); a supervisor of its own per action is the fallback
//! when that one cannot be started. An action that cannot be
//! started is the worker's failure when the worker is at fault (its pack directory, the
//! entrypoint or the interpreter gone: `action_not_found`, counted against its health) and the
//! request's when the request is (parameters the operating system refuses to pass, E2BIG:
//! `invalid_parameters`, not retried, not counted).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use attune_common::mq::{OutputStream, ResultStatus};
use attune_core::FailureKind;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

pub use crate::action::{ActionRun, Outcome, Ran};
use crate::destination::AllowList;
use crate::supervise::SpawnRequest;
use crate::supervise::client::{Ended, SpawnError, SupervisedRun, Supervisor};

/// EX_TEMPFAIL from sysexits.h: "temporary failure, try again later".
pub const TRANSIENT_EXIT_CODE: i32 = 75;
/// `sysexits.h`'s EX_DATAERR: the action says its input was bad (`validation_error`, not retried).
pub const VALIDATION_EXIT_CODE: i32 = 65;
/// `sysexits.h`'s EX_NOPERM: the action was refused what it needed (`permission_denied`, not
/// retried).
pub const PERMISSION_EXIT_CODE: i32 = 77;
const KILL_GRACE: Duration = Duration::from_secs(2);
/// Environment passed through to actions; everything else (DATABASE_URL, tokens) is withheld.
const INHERITED_ENV: [&str; 6] = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ"];

/// What happened to the process.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Finished {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Killed because the worker was shutting down past its drain deadline.
    pub aborted: bool,
    /// Killed because the worker's action supervisor was lost (killed, or stuck): the platform's
    /// failure, not the action's.
    pub supervisor_lost: bool,
    /// With `supervisor_lost`: the supervisor went on, but this run's start did not finish in
    /// time (its exec or directory waited on a stalled file system) and was given up.
    pub start_stuck: bool,
    /// The process could not be started.
    pub spawn_error: Option<StartFailure>,
    pub stdout: String,
    pub stderr: String,
}

/// Why an action could not be started, and whose fault that is.
#[derive(Debug, Clone, PartialEq)]
pub enum StartFailure {
    /// The worker's: its pack directory, the entrypoint or the interpreter is missing.
    Worker(String),
    /// The request's: its parameters cannot be passed to a program (too large).
    Request(String),
}

impl Ran {
    /// A finished process (or builtin), classified.
    pub fn of_process(finished: Finished, transient_exit_codes: &[i32]) -> Self {
        let outcome = classify(&finished, transient_exit_codes);
        Ran { exit_code: finished.exit_code, stdout: finished.stdout, stderr: finished.stderr, ..Ran::of(outcome) }
    }
}

/// Parses the result line: the last non-empty line of stdout, if it is a JSON object.
pub fn parse_result(stdout: &str) -> Option<Value> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    serde_json::from_str::<Value>(line.trim()).ok().filter(Value::is_object)
}

/// Classifies a finished process (pure).
pub fn classify(finished: &Finished, transient_exit_codes: &[i32]) -> Outcome {
    let result = parse_result(&finished.stdout);
    let failure = |kind: FailureKind, error: String| Outcome {
        status: ResultStatus::of_failure(kind),
        failure_kind: Some(kind),
        error: Some(error),
        result: result.clone(),
    };
    match &finished.spawn_error {
        Some(StartFailure::Worker(error)) => return failure(FailureKind::ActionNotFound, error.clone()),
        Some(StartFailure::Request(error)) => return failure(FailureKind::InvalidParameters, error.clone()),
        None => {}
    }
    if finished.aborted {
        return failure(FailureKind::WorkerUnavailable, "the worker shut down while the action was running".into());
    }
    if finished.supervisor_lost && finished.start_stuck {
        return failure(
            FailureKind::WorkerUnavailable,
            "the action's start did not finish on this worker (its exec waited, on a stalled file system?): \
             given up, and killed once it starts"
                .into(),
        );
    }
    if finished.supervisor_lost {
        return failure(
            FailureKind::WorkerUnavailable,
            "the worker's action supervisor was lost (killed, or stuck): the run was killed with it".into(),
        );
    }
    if finished.timed_out {
        return failure(FailureKind::Timeout, "the action exceeded its timeout and was killed".into());
    }
    // killed by its supervisor because the worker's lease ran out (the worker stalled)
    if finished.signal.is_some() && finished.stderr.lines().any(|line| line == crate::supervise::LEASE_EXPIRED) {
        return failure(
            FailureKind::WorkerHeartbeatStale,
            "the worker's lease on its runs ran out (its heartbeats stopped landing): the run was stopped".into(),
        );
    }
    // killed by its supervisor (or the kernel's backstop) for a limit, which the supervisor said
    if finished.signal.is_some()
        && let Some(report) = crate::supervise::LimitReport::find(&finished.stderr)
    {
        return failure(FailureKind::ResourceLimit, report.error());
    }
    // the kernel's file size limit (`RLIMIT_FSIZE`, a run as a user of its own) ended it
    if finished.exit_code.is_none() && finished.signal == Some(libc::SIGXFSZ) {
        return failure(
            FailureKind::ResourceLimit,
            "the action wrote past its file size limit (ATTUNE_ACTION_FILE_SIZE_MB) and was killed by SIGXFSZ".into(),
        );
    }
    let says_transient =
        result.as_ref().and_then(|r| r.pointer("/attune/transient")).and_then(Value::as_bool) == Some(true);
    match (finished.exit_code, finished.signal) {
        (Some(0), _) if !says_transient => {
            Outcome { status: ResultStatus::Completed, failure_kind: None, error: None, result }
        }
        (Some(code), _) if code == TRANSIENT_EXIT_CODE || transient_exit_codes.contains(&code) || says_transient => {
            failure(FailureKind::TransientError, format!("the action reported a transient failure (exit code {code})"))
        }
        (Some(VALIDATION_EXIT_CODE), _) => failure(
            FailureKind::ValidationError,
            format!("the action refused its input (exit code {VALIDATION_EXIT_CODE}, EX_DATAERR)"),
        ),
        (Some(PERMISSION_EXIT_CODE), _) => failure(
            FailureKind::PermissionDenied,
            format!("the action was denied what it needed (exit code {PERMISSION_EXIT_CODE}, EX_NOPERM)"),
        ),
        (Some(code), _) => failure(FailureKind::ActionFailed, format!("the action exited with code {code}")),
        (None, Some(signal)) => failure(FailureKind::ActionFailed, format!("the action was killed by signal {signal}")),
        (None, None) => failure(FailureKind::ActionFailed, "the action ended without an exit status".into()),
    }
}

/// The runtimes this worker offers, with interpreters resolved once at start (a pyenv shim on
/// PATH costs ~100 ms per start; the interpreter itself ~12 ms).
pub struct Runtimes {
    shell: Option<PathBuf>,
    python: Option<PathBuf>,
    builtin: bool,
    http: Option<crate::http::HttpClient>,
    /// The worker's own binary, which supervises its actions (see `crate::supervise`), if any:
    /// started once as the long-lived supervisor (`shared`), or per action as a fallback when
    /// that one cannot be started.
    supervisor: Option<PathBuf>,
    /// The worker's long-lived supervisor, which starts every process action.
    shared: Option<std::sync::Arc<Supervisor>>,
    /// The worker's `ATTUNE_PACKS_DIR`: a script runs only from a pack under it (`packs_under`).
    packs_root: Option<PathBuf>,
    /// The user ids actions run as, one of its own for each running action (`users`).
    users: Option<std::sync::Arc<ActionUsers>>,
}

pub use crate::action_users::{ActionUser, ActionUsers, UserLimits};

impl Runtimes {
    /// The runtimes of `wanted` this host can run; http actions may reach global addresses and
    /// those `http_allow` names.
    pub async fn detect(wanted: &[String], supervisor: Option<PathBuf>, http_allow: AllowList) -> Self {
        let wants = |r: &str| wanted.iter().any(|w| w == r);
        let python = if wants("python") { resolve_python().await } else { None };
        if wants("python") && python.is_none() {
            tracing::warn!("no python3 interpreter found; this worker will not offer the python runtime");
        }
        Runtimes {
            shell: wants("shell").then(|| PathBuf::from("/bin/sh")),
            python,
            builtin: wants("builtin"),
            http: wants("http").then(|| crate::http::HttpClient::new(http_allow)),
            shared: supervisor.clone().map(|program| std::sync::Arc::new(Supervisor::start(program))),
            supervisor,
            packs_root: None,
            users: None,
        }
    }

    /// Runs each process action as a user id of its own from `users` (the worker is root). An
    /// interpreter other users cannot run (a python under root's home, say) is replaced by the
    /// system's (`/usr/bin/python3`) if that one can be run, else the runtime is not offered.
    pub fn as_users(mut self, users: Option<ActionUsers>) -> Self {
        if users.is_some()
            && let Some(python) = self.python.take()
        {
            let system = PathBuf::from("/usr/bin/python3");
            self.python = if usable_by_others(&python) {
                Some(python)
            } else if usable_by_others(&system) {
                tracing::warn!(python = %python.display(), instead = %system.display(),
                    "actions run as other users, who cannot run this python: using the system's");
                Some(system)
            } else {
                tracing::warn!(python = %python.display(),
                    "actions run as other users, who cannot run this python: the python runtime is not offered");
                None
            };
        }
        self.users = users.map(std::sync::Arc::new);
        self
    }

    /// Runs scripts only from packs under `root` (the worker's `ATTUNE_PACKS_DIR`): a pack
    /// directory the database names elsewhere fails the execution as `action_not_found`.
    pub fn packs_under(mut self, root: PathBuf) -> Self {
        self.packs_root = Some(root);
        self
    }

    /// Says (a warning) when actions run as other users and the packs directory is closed to
    /// them: every script would fail to start.
    /// Why this worker could run none of the process actions it offers, if so: they run as users
    /// of their own (`ATTUNE_WORKER_ACTION_UIDS`) who cannot enter `ATTUNE_PACKS_DIR`. Such a
    /// worker must not start: it would take every such run and fail it as `action_not_found`.
    pub fn packs_closed(&self) -> Option<String> {
        let (Some(_), Some(root)) = (&self.users, &self.packs_root) else { return None };
        if (self.shell.is_none() && self.python.is_none()) || usable_by_others(root) {
            return None;
        }
        Some(format!(
            "actions run as users of their own (ATTUNE_WORKER_ACTION_UIDS), who cannot enter {}: make it and its \
             parents readable and searchable by others (0755), or set ATTUNE_WORKER_ACTION_UIDS=off, or offer no \
             process runtime (ATTUNE_WORKER_RUNTIMES without shell and python)",
            root.display()
        ))
    }

    /// Runs every process action under a supervisor of its own (`attune-worker supervise`), as
    /// the worker did before it had a long-lived supervisor: for comparisons.
    pub fn with_per_action_supervisors(mut self) -> Self {
        self.shared = None;
        self
    }

    /// The worker's long-lived supervisor, if it has one.
    pub fn shared_supervisor(&self) -> Option<&Supervisor> {
        self.shared.as_deref()
    }

    /// The process id of the worker's long-lived supervisor, while one runs.
    pub fn supervisor_pid(&self) -> Option<u32> {
        self.shared.as_ref()?.pid()
    }

    pub fn offered(&self) -> Vec<&'static str> {
        let mut offered = Vec::new();
        if self.shell.is_some() {
            offered.push("shell");
        }
        if self.python.is_some() {
            offered.push("python");
        }
        if self.builtin {
            offered.push("builtin");
        }
        if self.http.is_some() {
            offered.push("http");
        }
        offered
    }

    /// Runs an action of any runtime until it ends, its timeout passes or `abort` fires.
    pub async fn execute(&self, run: &ActionRun<'_>, abort: &CancellationToken) -> Ran {
        if run.runtime == "http"
            && let Some(http) = &self.http
        {
            return http.run(run, abort).await;
        }
        Ran::of_process(self.run(run, abort).await, run.transient_exit_codes)
    }

    /// Runs a process (or builtin) action; see `execute` for every runtime.
    pub async fn run(&self, run: &ActionRun<'_>, abort: &CancellationToken) -> Finished {
        let interpreter = match run.runtime {
            "builtin" if self.builtin => return run_builtin(run),
            "shell" => self.shell.as_ref(),
            "python" => self.python.as_ref(),
            _ => None,
        };
        let Some(interpreter) = interpreter else {
            return not_started(format!("this worker does not offer runtime '{}'", run.runtime));
        };
        // (a look through /proc, more if something of the id still ran: off the runtime's threads)
        let mut user = match self.users.clone() {
            Some(users) => match tokio::task::spawn_blocking(move || users.take()).await {
                Ok(Ok(user)) => Some(user),
                Ok(Err(error)) => return not_started(error),
                Err(e) => return not_started(format!("could not take a user id for the action: {e}")),
            },
            None => None,
        };
        let shared = self.shared.as_deref();
        let finished = run_process(
            interpreter,
            self.supervisor.as_deref(),
            shared,
            self.packs_root.as_deref(),
            &mut user,
            run,
            abort,
        )
        .await;
        // its processes killed (if the end did not), its temp directory removed, the id given back
        if let Some(user) = user {
            let _ = tokio::task::spawn_blocking(move || drop(user)).await;
        }
        finished
    }
}

async fn resolve_python() -> Option<PathBuf> {
    if let Some(explicit) =
        attune_common::settings::read_optional(&attune_common::settings::Environment, "ATTUNE_PYTHON")
    {
        return Some(PathBuf::from(explicit));
    }
    let output = tokio::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .await
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    (output.status.success() && path.is_file()).then_some(path)
}

fn run_builtin(run: &ActionRun<'_>) -> Finished {
    match run.entrypoint {
        "noop" => Finished { exit_code: Some(0), ..Default::default() },
        other => not_started(format!("unknown builtin '{other}'")),
    }
}

/// Not started, through the worker's fault.
fn not_started(error: String) -> Finished {
    Finished { spawn_error: Some(StartFailure::Worker(error)), ..Default::default() }
}

/// Whether users other than its owner may run `path`: it and every directory above it (links
/// followed) are executable by others.
fn usable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(real) = std::fs::canonicalize(path) else { return false };
    let others_may = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    others_may(&real) && real.ancestors().skip(1).all(others_may)
}

/// `ATTUNE_PARAM_<NAME>` for a parameter name: upper case, anything but letters and digits as `_`.
pub fn param_env_name(name: &str) -> String {
    let cleaned: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("ATTUNE_PARAM_{cleaned}")
}

/// The script an action's entrypoint names, checked before anything runs: the pack directory is an
/// absolute path, and the entrypoint a relative path that, symbolic links followed, names a file
/// inside it. The database says what to run, but neither a pack directory changed after its
/// registration (a link swapped for one that leads elsewhere) nor an edited record makes the
/// worker run a program outside the pack. With `packs_root` (the worker's `ATTUNE_PACKS_DIR`),
/// the pack directory must lie under it too, links followed: a record edited to name a
/// directory the worker's operator did not put there runs nothing. Returns the resolved path (the
/// one that runs); `Err` says why not, the worker's failure (`action_not_found`).
pub fn resolve_entrypoint(packs_root: Option<&Path>, pack_path: &Path, entrypoint: &str) -> Result<PathBuf, String> {
    use std::path::Component;
    if !pack_path.is_absolute() {
        return Err(format!("the pack directory '{}' is not an absolute path", pack_path.display()));
    }
    let relative = Path::new(entrypoint);
    if entrypoint.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(format!("the entrypoint '{entrypoint}' is not a path inside its pack directory"));
    }
    let root = std::fs::canonicalize(pack_path)
        .map_err(|_| format!("the pack directory {} is missing on this worker", pack_path.display()))?;
    if let Some(packs_root) = packs_root {
        let allowed = std::fs::canonicalize(packs_root).map_err(|_| {
            format!("this worker's ATTUNE_PACKS_DIR {} is missing: it runs no script", packs_root.display())
        })?;
        if !root.starts_with(&allowed) {
            return Err(format!(
                "the pack directory {} is not under this worker's ATTUNE_PACKS_DIR {}",
                pack_path.display(),
                allowed.display()
            ));
        }
    }
    let script = pack_path.join(relative);
    let resolved = std::fs::canonicalize(&script)
        .map_err(|_| format!("the entrypoint {} is missing on this worker", script.display()))?;
    if !resolved.starts_with(&root) {
        return Err(format!(
            "the entrypoint {} leads outside its pack directory {} (to {})",
            script.display(),
            root.display(),
            resolved.display()
        ));
    }
    if !resolved.is_file() {
        return Err(format!("the entrypoint {} is not a file", script.display()));
    }
    Ok(resolved)
}

/// The whole environment of a process action, in order (a later entry of the same name wins):
/// the allow-list of the worker's own (`INHERITED_ENV`), the private temp directory of a run
/// as a user of its own (`TMPDIR`, `TMP`, `TEMP` and `HOME`), the run's `ATTUNE_*` and its
/// parameters, as data.
fn action_env(run: &ActionRun<'_>, user: Option<&ActionUser>) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for name in INHERITED_ENV {
        if let Ok(value) = std::env::var(name) {
            env.push((name.to_string(), value));
        }
    }
    if let Some(user) = user {
        let dir = user.temp_dir.display().to_string();
        for name in ["TMPDIR", "TMP", "TEMP", "HOME"] {
            env.push((name.to_string(), dir.clone()));
        }
    }
    env.push(("ATTUNE_EXECUTION_ID".into(), run.execution_id.to_string()));
    env.push(("ATTUNE_ACTION_REF".into(), run.action_ref.to_string()));
    env.push(("ATTUNE_RETRY_COUNT".into(), run.retry_count.to_string()));
    env.push(("ATTUNE_IDEMPOTENCY_KEY".into(), run.idempotency_key.to_string()));
    env.push(("ATTUNE_PARAMETERS".into(), run.parameters.to_string()));
    if let Some(traceparent) = run.traceparent {
        // (W3C Trace Context's name for the environment: OpenTelemetry SDKs read it)
        env.push(("TRACEPARENT".into(), traceparent.to_string()));
    }
    if let Some(parameters) = run.parameters.as_object() {
        for (name, value) in parameters {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            env.push((param_env_name(name), text));
        }
    }
    env
}

/// The parameters are more than the system passes to a program (as environment variables).
fn too_large(e: impl std::fmt::Display) -> Finished {
    let failure = format!(
        "the parameters are too large to pass to the action ({e}); the API's limits \
         (ATTUNE_API_MAX_PARAMETERS_BYTES, ATTUNE_API_MAX_PARAMETER_VALUE_BYTES) keep them below this"
    );
    Finished { spawn_error: Some(StartFailure::Request(failure)), ..Default::default() }
}

#[allow(clippy::too_many_arguments)]
async fn run_process(
    interpreter: &Path,
    supervisor: Option<&Path>,
    shared: Option<&Supervisor>,
    packs_root: Option<&Path>,
    user: &mut Option<ActionUser>,
    run: &ActionRun<'_>,
    abort: &CancellationToken,
) -> Finished {
    // what is missing on this worker, or leads outside the pack, is its own failure, told apart
    // from the action's exit code
    let script = match resolve_entrypoint(packs_root, &run.pack_path, run.entrypoint) {
        Ok(script) => script,
        Err(error) => return not_started(error),
    };
    if std::fs::metadata(interpreter).is_err() {
        return not_started(format!("the interpreter {} is missing on this worker", interpreter.display()));
    }
    let limits = match crate::supervise::limits_for(run.limits, run.output_limit) {
        Ok(limits) => limits,
        Err(error) => return not_started(format!("this worker's limit settings are invalid: {error}")),
    };
    if let Some(shared) = shared
        && let Some(finished) = run_supervised(shared, interpreter, &script, user, &limits, run, abort).await
    {
        return finished;
    }
    // no long-lived supervisor (the worker library used directly), or it cannot be started:
    // the action runs directly, or under a supervisor of its own
    let mut command = match supervisor {
        Some(supervisor) => {
            let mut command = tokio::process::Command::new(supervisor);
            if let Some(name) = crate::supervise::shown_name(supervisor) {
                command.arg0(name);
            }
            command.arg(crate::supervise::MODE).arg(std::process::id().to_string());
            command.args(crate::supervise::limit_args(&limits));
            if let Some(lease_file) = crate::supervise::lease_file() {
                command.arg(format!("--lease-file={}", lease_file.display()));
            }
            if let Some(user) = user.as_ref() {
                command.arg(format!("--uid={}", user.uid));
                command.arg(format!("--processes={}", user.limits.processes));
                command.arg(format!("--file-size-bytes={}", user.limits.file_size_bytes));
            }
            command.arg(interpreter);
            command
        }
        None => {
            let mut command = tokio::process::Command::new(interpreter);
            if let Some(user) = user.as_ref() {
                command.uid(user.uid).gid(user.uid);
                let (processes, file_size) = (user.limits.processes, user.limits.file_size_bytes);
                // SAFETY: the closure runs in the forked child before exec and makes only
                // async-signal-safe system calls (umask, prctl, setrlimit) on values copied before
                // the fork; it allocates nothing.
                #[allow(unsafe_code)]
                unsafe {
                    command.pre_exec(move || {
                        libc::umask(0o077);
                        // (no exec gains a user or a capability: `supervise::spawn`)
                        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        for (resource, limit) in [(libc::RLIMIT_NPROC, processes), (libc::RLIMIT_FSIZE, file_size)] {
                            let limit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                            if libc::setrlimit(resource, &limit) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                        }
                        Ok(())
                    });
                }
            }
            command
        }
    };
    command
        .arg(&script)
        .current_dir(&run.pack_path)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    command.envs(action_env(run, user.as_ref()));
    let mut child = match command.spawn() {
        Ok(child) => child,
        // the parameters (as environment variables) are more than the system passes to a program
        Err(e) if e.raw_os_error() == Some(libc::E2BIG) => return too_large(e),
        Err(e) => return not_started(format!("could not start {}: {e}", script.display())),
    };
    let process_group = child.id().map(|id| id as i32);
    // if this future is dropped mid-run (its task aborted), the whole group goes with it
    let _group = process_group.map(GroupGuard);
    let stdin_body = run.parameters.to_string();
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let feed = tokio::spawn(async move {
        // A script that does not read stdin closes it early; that is not an error.
        let _ = stdin.write_all(stdin_body.as_bytes()).await;
    });
    let output_limit = usize::try_from(limits.output_bytes).unwrap_or(usize::MAX);
    let capture = run.capture.cloned().unwrap_or_default();
    let (out, err) = (OutputStream::Stdout, OutputStream::Stderr);
    let stdout =
        tokio::spawn(read_bounded(child.stdout.take().expect("stdout is piped"), output_limit, capture.clone(), out));
    let stderr =
        tokio::spawn(read_bounded(child.stderr.take().expect("stderr is piped"), output_limit, capture.clone(), err));

    let mut finished = Finished::default();
    let status = tokio::select! {
        // (in this order: a kill fired with a cancel, the lease's, kills at once)
        biased;
        _ = killed(run.kill) => {
            finished.aborted = true;
            if let Some(pgid) = process_group {
                signal_group(pgid, libc::SIGKILL);
            }
            child.wait().await.ok()
        }
        status = child.wait() => status.ok(),
        _ = tokio::time::sleep(run.timeout) => {
            finished.timed_out = true;
            terminate(&mut child, process_group).await
        }
        _ = abort.cancelled() => {
            finished.aborted = true;
            terminate(&mut child, process_group).await
        }
    };
    // Grandchildren that kept the pipes open are gone with the group (and with the user's
    // sweep, those that left it); stop waiting after a bound.
    if let Some(pgid) = process_group {
        signal_group(pgid, libc::SIGKILL);
    }
    sweep_user(user).await;
    feed.abort();
    finished.stdout = tokio::time::timeout(KILL_GRACE, stdout).await.ok().and_then(Result::ok).unwrap_or_default();
    finished.stderr = tokio::time::timeout(KILL_GRACE, stderr).await.ok().and_then(Result::ok).unwrap_or_default();
    if let Some(status) = status {
        use std::os::unix::process::ExitStatusExt;
        finished.exit_code = status.code();
        finished.signal = status.signal();
    }
    finished
}

/// Runs a process action through the worker's long-lived supervisor; `None` when no supervisor
/// can be started (the caller then runs it under a supervisor of its own).
async fn run_supervised(
    supervisor: &Supervisor,
    interpreter: &Path,
    script: &Path,
    user: &mut Option<ActionUser>,
    limits: &attune_core::pack::Limits,
    run: &ActionRun<'_>,
    abort: &CancellationToken,
) -> Option<Finished> {
    let user_limits = user.as_ref().map(|user| user.limits);
    let request = SpawnRequest {
        program: interpreter.into(),
        args: vec![script.into()],
        cwd: run.pack_path.clone().into(),
        env: action_env(run, user.as_ref()).into_iter().map(|(name, value)| format!("{name}={value}").into()).collect(),
        lease_file: crate::supervise::lease_file().map(Into::into),
        memory_mb: Some(limits.memory_mb).filter(|mb| *mb > 0),
        cpu_secs: limits.cpu_secs.filter(|secs| *secs > 0),
        open_files: Some(limits.open_files).filter(|files| *files > 0),
        uid: user.as_ref().map(|user| user.uid),
        processes: user_limits.map(|limits| limits.processes),
        file_size_bytes: user_limits.map(|limits| limits.file_size_bytes),
    };
    let pipes = (crate::supervise::pipe(), crate::supervise::pipe(), crate::supervise::pipe());
    let ((stdin, stdin_writer), (stdout_reader, stdout), (stderr_reader, stderr)) = match pipes {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return Some(not_started(format!("could not start {}: no pipe for its output: {e}", script.display())));
        }
    };
    let mut child = match supervisor.spawn(&request, [stdin, stdout, stderr]).await {
        Ok(child) => child,
        Err(SpawnError::Unavailable(e)) => {
            tracing::warn!(error = %e, "the action supervisor cannot be started: this run has a supervisor of its own");
            return None;
        }
        Err(SpawnError::NotStarted { errno, message }) if errno == libc::E2BIG => return Some(too_large(message)),
        Err(SpawnError::NotStarted { message, .. }) => {
            return Some(not_started(format!("could not start {}: {message}", script.display())));
        }
        Err(SpawnError::Lost) => {
            return Some(Finished {
                signal: Some(libc::SIGKILL),
                supervisor_lost: true,
                stderr: LOST.into(),
                ..Default::default()
            });
        }
        Err(SpawnError::Stuck) => {
            return Some(Finished {
                signal: Some(libc::SIGKILL),
                supervisor_lost: true,
                start_stuck: true,
                stderr: STUCK.into(),
                ..Default::default()
            });
        }
    };
    let stdin_body = run.parameters.to_string();
    let feed = tokio::spawn(async move {
        // A script that does not read stdin closes it early; that is not an error.
        if let Ok(mut stdin) = tokio::net::unix::pipe::Sender::from_owned_fd(stdin_writer) {
            let _ = stdin.write_all(stdin_body.as_bytes()).await;
        }
    });
    let output_limit = usize::try_from(limits.output_bytes).unwrap_or(usize::MAX);
    let capture = run.capture.cloned().unwrap_or_default();
    let read = |fd: std::os::fd::OwnedFd, stream: OutputStream| {
        let capture = capture.clone();
        tokio::spawn(async move {
            match tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
                Ok(reader) => read_bounded(reader, output_limit, capture, stream).await,
                Err(_) => String::new(),
            }
        })
    };
    let stdout = read(stdout_reader, OutputStream::Stdout);
    let stderr = read(stderr_reader, OutputStream::Stderr);

    let mut finished = Finished::default();
    let ended = tokio::select! {
        // (in this order: a kill fired with a cancel, the lease's, kills at once)
        biased;
        _ = killed(run.kill) => {
            finished.aborted = true;
            child.signal(libc::SIGKILL);
            child.wait().await
        }
        ended = child.wait() => ended,
        _ = tokio::time::sleep(run.timeout) => {
            finished.timed_out = true;
            terminate_supervised(&mut child).await
        }
        _ = abort.cancelled() => {
            finished.aborted = true;
            terminate_supervised(&mut child).await
        }
    };
    // (the supervisor SIGKILLed the rest of the group before it reaped the action; the sweep
    // kills what left the group, so that its copies of the output pipes close)
    sweep_user(user).await;
    feed.abort();
    finished.stdout = tokio::time::timeout(KILL_GRACE, stdout).await.ok().and_then(Result::ok).unwrap_or_default();
    finished.stderr = tokio::time::timeout(KILL_GRACE, stderr).await.ok().and_then(Result::ok).unwrap_or_default();
    match ended {
        Ended::Exited(status) => {
            use std::os::unix::process::ExitStatusExt;
            let status = std::process::ExitStatus::from_raw(status);
            finished.exit_code = status.code();
            finished.signal = status.signal();
        }
        Ended::Lost => {
            finished.signal = Some(libc::SIGKILL);
            finished.supervisor_lost = true;
            finished.stderr.push_str(LOST);
        }
    }
    Some(finished)
}

/// Kills every process of the run's user once its process has ended (blocking, off the
/// runtime's threads): what it left behind lets go of the output pipes at once, and is gone
/// before the run's result is reported.
async fn sweep_user(user: &mut Option<ActionUser>) {
    if user.as_mut().is_some_and(ActionUser::nothing_left) {
        return;
    }
    if let Some(mut taken) = user.take() {
        *user = tokio::task::spawn_blocking(move || {
            taken.sweep();
            taken
        })
        .await
        .ok();
    }
}

/// What a run whose start was given up says on its stderr.
const STUCK: &str =
    "\nattune-worker: the action's start did not finish in time (a stalled file system?); it was given up\n";

/// What a run whose supervisor was lost says on its stderr.
const LOST: &str = "\nattune-worker: the action's supervisor was lost; its process group was killed\n";

/// SIGTERM to the whole group, SIGKILL after the grace period, through the supervisor.
async fn terminate_supervised(child: &mut SupervisedRun) -> Ended {
    child.signal(libc::SIGTERM);
    match tokio::time::timeout(KILL_GRACE, child.wait()).await {
        Ok(ended) => ended,
        Err(_) => {
            child.signal(libc::SIGKILL);
            child.wait().await
        }
    }
}

/// Fires with `kill`, never without one.
async fn killed(kill: Option<&CancellationToken>) {
    match kill {
        Some(kill) => kill.cancelled().await,
        None => std::future::pending().await,
    }
}

/// SIGTERM to the whole group, SIGKILL after the grace period.
async fn terminate(child: &mut tokio::process::Child, process_group: Option<i32>) -> Option<std::process::ExitStatus> {
    let pgid = process_group?;
    signal_group(pgid, libc::SIGTERM);
    match tokio::time::timeout(KILL_GRACE, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            signal_group(pgid, libc::SIGKILL);
            child.wait().await.ok()
        }
    }
}

/// SIGKILLs a process group when dropped (`kill_on_drop` reaches only the direct child).
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        signal_group(self.0, libc::SIGKILL);
    }
}

#[allow(unsafe_code)]
fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group; it has no memory-safety
    // preconditions. The group was created for this child alone (process_group(0)).
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// Reads a stream to its end into `capture`, which keeps about the last `limit` bytes (twice
/// that at most) where a follower can read them; the stored output is the last `limit`.
async fn read_bounded(
    mut reader: impl AsyncRead + Unpin,
    limit: usize,
    capture: std::sync::Arc<crate::live::Capture>,
    stream: OutputStream,
) -> String {
    let mut chunk = vec![0u8; 8192];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => capture.append(stream, &chunk[..n], limit),
        }
    }
    capture.text(stream, limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exited(code: i32, stdout: &str) -> Finished {
        Finished { exit_code: Some(code), stdout: stdout.into(), ..Default::default() }
    }

    #[test]
    fn classification_of_finished_processes() {
        let limit_line =
            format!("{}{{\"limit\":\"memory_mb\",\"value\":128,\"used\":140.2}}", crate::supervise::REPORT_PREFIX);
        let cases = [
            (exited(0, "hello\n"), ResultStatus::Completed, None),
            (exited(1, ""), ResultStatus::Failed, Some(FailureKind::ActionFailed)),
            (exited(75, ""), ResultStatus::Failed, Some(FailureKind::TransientError)),
            (exited(65, ""), ResultStatus::Failed, Some(FailureKind::ValidationError)),
            (exited(77, ""), ResultStatus::Failed, Some(FailureKind::PermissionDenied)),
            (exited(3, ""), ResultStatus::Failed, Some(FailureKind::TransientError)), // policy code
            (
                exited(1, "{\"attune\": {\"transient\": true}}\n"),
                ResultStatus::Failed,
                Some(FailureKind::TransientError),
            ),
            (Finished { timed_out: true, ..Default::default() }, ResultStatus::Timeout, Some(FailureKind::Timeout)),
            (
                Finished { aborted: true, ..Default::default() },
                ResultStatus::Failed,
                Some(FailureKind::WorkerUnavailable),
            ),
            (Finished { signal: Some(9), ..Default::default() }, ResultStatus::Failed, Some(FailureKind::ActionFailed)),
            (
                Finished { signal: Some(libc::SIGXFSZ), ..Default::default() },
                ResultStatus::Failed,
                Some(FailureKind::ResourceLimit),
            ),
            (
                Finished { spawn_error: Some(StartFailure::Worker("x".into())), ..Default::default() },
                ResultStatus::Failed,
                Some(FailureKind::ActionNotFound),
            ),
            (
                Finished { spawn_error: Some(StartFailure::Request("x".into())), ..Default::default() },
                ResultStatus::Failed,
                Some(FailureKind::InvalidParameters),
            ),
            (
                Finished { signal: Some(9), stderr: format!("{limit_line}\n"), ..Default::default() },
                ResultStatus::Failed,
                Some(FailureKind::ResourceLimit),
            ),
            // a report line is believed only from a run that a signal ended
            (
                Finished { exit_code: Some(1), stderr: limit_line.clone(), ..Default::default() },
                ResultStatus::Failed,
                Some(FailureKind::ActionFailed),
            ),
        ];
        for (finished, status, kind) in cases {
            let outcome = classify(&finished, &[3]);
            assert_eq!((outcome.status, outcome.failure_kind), (status, kind), "{finished:?}");
            assert_eq!(outcome.error.is_some(), kind.is_some());
        }
    }

    #[test]
    fn the_result_is_the_last_json_object_line() {
        assert_eq!(parse_result("log\n{\"a\": 1}\n\n"), Some(json!({"a": 1})));
        assert_eq!(parse_result("{\"a\": 1}\nplain\n"), None);
        assert_eq!(parse_result("[1, 2]\n"), None);
        assert_eq!(parse_result(""), None);
    }

    #[test]
    fn parameter_names_become_env_names() {
        assert_eq!(param_env_name("message"), "ATTUNE_PARAM_MESSAGE");
        assert_eq!(param_env_name("max-count.v2"), "ATTUNE_PARAM_MAX_COUNT_V2");
    }

    #[test]
    fn an_interpreter_under_a_closed_directory_is_not_usable_by_other_users() {
        use std::os::unix::fs::PermissionsExt;
        assert!(usable_by_others(Path::new("/bin/sh")));
        let dir = std::env::temp_dir().join(format!("attune-closed-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("python3");
        std::fs::write(&program, "").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(usable_by_others(&program));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(!usable_by_others(&program), "its directory is closed to others");
        assert!(!usable_by_others(&dir.join("missing")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn temp_pack(script: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("attune-runner-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("run.sh"), script).unwrap();
        dir
    }

    fn run_of<'a>(dir: &Path, parameters: &'a Value, timeout: Duration, limit: usize) -> ActionRun<'a> {
        ActionRun {
            execution_id: 7,
            action_ref: "test.run",
            runtime: "shell",
            pack_path: dir.to_path_buf(),
            entrypoint: "run.sh",
            parameters,
            timeout,
            retry_count: 0,
            output_limit: limit,
            transient_exit_codes: &[],
            http: None,
            idempotency_key: "key-7",
            limits: None,
            kill: None,
            traceparent: None,
            capture: None,
        }
    }

    #[tokio::test]
    async fn parameters_arrive_as_data_not_shell_text() {
        let dir = temp_pack(
            "printf '%s|' \"$ATTUNE_PARAM_MESSAGE\" \"$ATTUNE_PARAM_COUNT\"; cat; echo; env | grep -c CARGO_MANIFEST_DIR || true\n",
        );
        // cargo sets CARGO_MANIFEST_DIR for the test process; like DATABASE_URL, it must not leak
        assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok());
        let parameters = json!({"message": "$(touch /tmp/pwned); `id`; 'q\"", "count": 3});
        let runtimes = Runtimes::detect(&["shell".into()], None, AllowList::default()).await;
        let finished =
            runtimes.run(&run_of(&dir, &parameters, Duration::from_secs(10), 4096), &CancellationToken::new()).await;
        assert_eq!(finished.exit_code, Some(0), "{finished:?}");
        let mut lines = finished.stdout.lines();
        let first = lines.next().unwrap();
        assert!(first.starts_with("$(touch /tmp/pwned); `id`; 'q\"|3|"), "{first}");
        assert!(first.ends_with(&parameters.to_string()), "{first}");
        assert_eq!(lines.next(), Some("0"), "the worker's environment must not reach actions");
    }

    #[tokio::test]
    async fn the_chains_idempotency_key_reaches_the_action() {
        let dir = temp_pack("printf '%s' \"$ATTUNE_IDEMPOTENCY_KEY\"\n");
        let parameters = json!({"idempotency_key": "not this"});
        let runtimes = Runtimes::detect(&["shell".into()], None, AllowList::default()).await;
        let ran = runtimes
            .execute(&run_of(&dir, &parameters, Duration::from_secs(10), 4096), &CancellationToken::new())
            .await;
        assert_eq!((ran.outcome.status, ran.stdout.as_str()), (ResultStatus::Completed, "key-7"), "{ran:?}");
    }

    #[tokio::test]
    async fn the_runs_traceparent_reaches_the_action_only_when_there_is_one() {
        let dir = temp_pack("printf '%s' \"${TRACEPARENT-unset}\"\n");
        let parameters = json!({"traceparent": "not this"});
        let runtimes = Runtimes::detect(&["shell".into()], None, AllowList::default()).await;
        let traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let run = ActionRun { traceparent: Some(traced), ..run_of(&dir, &parameters, Duration::from_secs(10), 4096) };
        let ran = runtimes.execute(&run, &CancellationToken::new()).await;
        assert_eq!((ran.outcome.status, ran.stdout.as_str()), (ResultStatus::Completed, traced), "{ran:?}");
        let ran = runtimes
            .execute(&run_of(&dir, &parameters, Duration::from_secs(10), 4096), &CancellationToken::new())
            .await;
        assert_eq!(ran.stdout, "unset", "{ran:?}");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let dir = temp_pack("sleep 30 &\necho $! > child.pid\nsleep 30\n");
        let parameters = json!({});
        let runtimes = Runtimes::detect(&["shell".into()], None, AllowList::default()).await;
        let started = std::time::Instant::now();
        let finished =
            runtimes.run(&run_of(&dir, &parameters, Duration::from_millis(300), 4096), &CancellationToken::new()).await;
        assert!(finished.timed_out);
        assert!(started.elapsed() < Duration::from_secs(10));
        let pid: i32 = std::fs::read_to_string(dir.join("child.pid")).unwrap().trim().parse().unwrap();
        // the background grandchild is gone too (give the kernel a moment to reap it)
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z")
        {
            assert!(std::time::Instant::now() < deadline, "grandchild {pid} survived the timeout");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(classify(&finished, &[]).failure_kind, Some(FailureKind::Timeout));
    }

    #[tokio::test]
    async fn output_is_bounded_to_its_tail() {
        let dir = temp_pack("i=0; while [ $i -lt 5000 ]; do echo line-$i; i=$((i+1)); done\n");
        let parameters = json!({});
        let runtimes = Runtimes::detect(&["shell".into()], None, AllowList::default()).await;
        let finished =
            runtimes.run(&run_of(&dir, &parameters, Duration::from_secs(10), 1000), &CancellationToken::new()).await;
        assert!(finished.stdout.starts_with("[... "), "{}", &finished.stdout[..40]);
        assert!(finished.stdout.ends_with("line-4999\n"));
        assert!(finished.stdout.len() < 1100);
    }

    #[test]
    fn an_entrypoint_runs_only_from_inside_its_pack() {
        let pack = temp_pack("echo inside\n");
        let outside = temp_pack("echo outside\n");
        std::fs::create_dir_all(pack.join("actions")).unwrap();
        std::os::unix::fs::symlink(pack.join("run.sh"), pack.join("actions/inner.sh")).unwrap();
        std::os::unix::fs::symlink(outside.join("run.sh"), pack.join("actions/outer.sh")).unwrap();
        std::os::unix::fs::symlink(&outside, pack.join("elsewhere")).unwrap();
        let inside = std::fs::canonicalize(pack.join("run.sh")).unwrap();
        assert_eq!(resolve_entrypoint(None, &pack, "run.sh"), Ok(inside.clone()));
        assert_eq!(resolve_entrypoint(None, &pack, "./run.sh"), Ok(inside.clone()));
        assert_eq!(resolve_entrypoint(None, &pack, "actions/inner.sh"), Ok(inside.clone()), "a link within the pack");
        // under the worker's packs directory, or nowhere
        let packs_root = pack.parent().unwrap();
        assert_eq!(resolve_entrypoint(Some(packs_root), &pack, "run.sh"), Ok(inside));
        let error = resolve_entrypoint(Some(&packs_root.join("elsewhere-root")), &pack, "run.sh").unwrap_err();
        assert!(error.contains("ATTUNE_PACKS_DIR") && error.contains("is missing"), "{error}");
        std::fs::create_dir_all(packs_root.join("other-root")).unwrap();
        let error = resolve_entrypoint(Some(&packs_root.join("other-root")), &pack, "run.sh").unwrap_err();
        assert!(error.contains("not under this worker's ATTUNE_PACKS_DIR"), "{error}");
        let refused = |pack: &Path, entrypoint: &str, why: &str| {
            let error = resolve_entrypoint(None, pack, entrypoint).unwrap_err();
            assert!(error.contains(why), "{entrypoint}: {error}");
        };
        refused(&pack, "actions/outer.sh", "leads outside its pack directory");
        refused(&pack, "elsewhere/run.sh", "leads outside its pack directory");
        refused(&pack, "../run.sh", "not a path inside");
        refused(&pack, "actions/../../run.sh", "not a path inside");
        refused(&pack, outside.join("run.sh").to_str().unwrap(), "not a path inside");
        refused(&pack, "", "not a path inside");
        refused(&pack, "missing.sh", "missing on this worker");
        refused(&pack, "actions", "not a file");
        refused(Path::new("relative/pack"), "run.sh", "not an absolute path");
        refused(&pack.join("gone"), "run.sh", "pack directory");
    }

    #[tokio::test]
    async fn an_entrypoint_outside_the_pack_is_the_workers_failure_and_never_runs() {
        let pack = temp_pack("echo inside\n");
        let outside = temp_pack("touch marker\n");
        std::fs::remove_file(pack.join("run.sh")).unwrap();
        std::os::unix::fs::symlink(outside.join("run.sh"), pack.join("run.sh")).unwrap();
        let parameters = json!({});
        let runtimes = Runtimes::detect(&["shell".into()], None, AllowList::default()).await;
        let ran = runtimes
            .execute(&run_of(&pack, &parameters, Duration::from_secs(10), 4096), &CancellationToken::new())
            .await;
        assert_eq!(ran.outcome.failure_kind, Some(FailureKind::ActionNotFound), "{ran:?}");
        assert!(ran.outcome.error.unwrap().contains("leads outside its pack directory"));
        assert!(!outside.join("marker").exists() && !pack.join("marker").exists(), "the script ran");
    }

    #[tokio::test]
    async fn a_runtime_this_worker_does_not_offer_is_not_run() {
        let pack = temp_pack("touch marker\n");
        let parameters = json!({});
        let runtimes = Runtimes::detect(&["python".into()], None, AllowList::default()).await;
        let ran = runtimes
            .execute(&run_of(&pack, &parameters, Duration::from_secs(10), 4096), &CancellationToken::new())
            .await;
        assert_eq!(ran.outcome.failure_kind, Some(FailureKind::ActionNotFound), "{ran:?}");
        assert!(!pack.join("marker").exists(), "the script ran");
    }
}
