//! Every setting attune reads from the environment, written down once: its name, its default,
//! the processes that read it and what it does. The services read their settings through
//! [`get`] (so the default here is the default in force), each binary's `--help` lists its own
//! ([`help`]), and the book's table (`book/src/settings.md`) is generated from this one ([`markdown_table`];
//! `make settings-doc` rewrites it, and `tests/tests/tidy/settings_doc.rs` fails when it is stale).

use std::str::FromStr;

use crate::config::ConfigError;

/// A process that reads settings. `attune up` runs the API, the executor and workers in one
/// process, so it reads all of theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Api,
    Executor,
    Worker,
    /// The `attune` command line.
    Cli,
    /// `attune-bench`.
    Bench,
}

impl Process {
    pub fn as_str(self) -> &'static str {
        match self {
            Process::Api => "api",
            Process::Executor => "executor",
            Process::Worker => "worker",
            Process::Cli => "cli",
            Process::Bench => "bench",
        }
    }
}

/// A setting's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// A value, parsed as the setting's type when the variable is unset or empty.
    Value(&'static str),
    /// Computed by the process (a host name, an interpreter found at start) or none; said here.
    Described(&'static str),
}

#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub name: &'static str,
    pub default: Fallback,
    pub read_by: &'static [Process],
    pub doc: &'static str,
}

use Fallback::{Described, Value};
use Process::{Api, Bench, Cli, Executor, Worker};

const SERVICES: &[Process] = &[Api, Executor, Worker];

/// The settings, in the order the book's settings table lists them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "DATABASE_URL",
        default: Value("postgres://attune:attune@127.0.0.1:5432/attune"),
        read_by: &[Api, Executor, Worker, Cli, Bench],
        doc: "the PostgreSQL database (the CLI's `token create` writes to it; `attune-bench` reads the record); a primary and its standbys in libpq's multi-host form, `postgres://u:p@db1:5432,db2:5432/attune?target_session_attrs=read-write`, and each pool follows the host that takes writes (Operating: PostgreSQL with a standby)",
    },
    Setting {
        name: "ATTUNE_DB_STATEMENT_TIMEOUT_SECS",
        default: Value("60"),
        read_by: &[Api, Executor, Worker, Cli, Bench],
        doc: "the longest a statement may run on any attune database session (`statement_timeout`; migrations, vacuum and the benchmark's loader are exempt); 0 turns it off",
    },
    Setting {
        name: "ATTUNE_DB_LOCK_TIMEOUT_SECS",
        default: Value("5"),
        read_by: &[Api, Executor, Worker, Cli, Bench],
        doc: "the longest a statement waits for a lock (`lock_timeout`): a session stuck behind a stalled holder gives its connection back and tries again; 0 turns it off",
    },
    Setting {
        name: "ATTUNE_DB_IDLE_IN_TRANSACTION_SECS",
        default: Value("30"),
        read_by: &[Api, Executor, Worker, Cli, Bench],
        doc: "a session idle this long inside a transaction (its process stalled or cut off) is ended by the server and its locks released (`idle_in_transaction_session_timeout`); 0 turns it off",
    },
    Setting {
        name: "AMQP_URL",
        default: Value("amqp://guest:guest@127.0.0.1:5672/%2f"),
        read_by: SERVICES,
        doc: "the RabbitMQ broker; the nodes of a cluster as several URLs separated by commas (each connection tries them in turn, starting after the node the last one started with)",
    },
    Setting {
        name: "ATTUNE_AMQP_CA_CERT",
        default: Described("— (the system's roots)"),
        read_by: SERVICES,
        doc: "a PEM file of CA certificates an `amqps://` broker's certificate may be signed by, besides the system's roots (a private CA)",
    },
    Setting {
        name: "ATTUNE_MQ_NAMESPACE",
        default: Value("attune"),
        read_by: SERVICES,
        doc: "prefix of every exchange and queue",
    },
    Setting {
        name: "ATTUNE_PACKS_DIR",
        default: Value("./packs"),
        read_by: SERVICES,
        doc: "registered by the API (and `attune up`) at start-up",
    },
    Setting {
        name: "ATTUNE_DEFAULT_TIMEOUT_SECS",
        default: Value("300"),
        read_by: SERVICES,
        doc: "action timeout when the action declares none",
    },
    Setting { name: "ATTUNE_API_ADDR", default: Value("0.0.0.0:8080"), read_by: &[Api], doc: "API listen address" },
    Setting {
        name: "ATTUNE_API_TLS_CERT_FILE",
        default: Described("— (plain HTTP)"),
        read_by: &[Api],
        doc: "a PEM file of the API's certificate chain: with `ATTUNE_API_TLS_KEY_FILE` (both or neither), the API serves HTTPS only (rustls)",
    },
    Setting {
        name: "ATTUNE_API_TLS_KEY_FILE",
        default: Described("—"),
        read_by: &[Api],
        doc: "a PEM file of the private key of `ATTUNE_API_TLS_CERT_FILE` (PKCS#8, PKCS#1 or SEC1)",
    },
    Setting {
        name: "ATTUNE_API_HEADER_TIMEOUT_SECS",
        default: Value("10"),
        read_by: &[Api],
        doc: "a connection that has not sent a request's headers (or finished its TLS handshake) this long is closed; so is a keep-alive connection idle this long",
    },
    Setting {
        name: "ATTUNE_API_REQUEST_TIMEOUT_SECS",
        default: Value("30"),
        read_by: &[Api],
        doc: "a request not answered this long (its body read and its handler run) is answered 503 `request_timeout`",
    },
    Setting {
        name: "ATTUNE_API_OUTPUT_STREAM_MAX_SECS",
        default: Value("900"),
        read_by: &[Api],
        doc: "a live output stream (`GET /api/v1/executions/{id}/output`, `attune execution tail`) lasts at most this long, then ends with a `closed` event that says it may be opened again where it was (`attune execution tail` does; the request timeout does not cut it)",
    },
    Setting {
        name: "ATTUNE_API_OUTPUT_STREAM_IDLE_SECS",
        default: Value("300"),
        read_by: &[Api],
        doc: "a live output stream on which nothing was sent this long, or whose client took no event this long, ends with a `closed` event (one with nothing sent says it may be opened again)",
    },
    Setting {
        name: "ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN",
        default: Value("8"),
        read_by: &[Api],
        doc: "live output streams one token may have open at once; one more is refused (`429 too_many_streams`). Streams do not take the `ATTUNE_API_MAX_CONNECTIONS` slots",
    },
    Setting {
        name: "ATTUNE_API_OUTPUT_STREAMS",
        default: Value("256"),
        read_by: &[Api],
        doc: "live output streams open at once, of all tokens (each holds a connection beside the `ATTUNE_API_MAX_CONNECTIONS` slots); one more is refused (`429 too_many_streams`)",
    },
    Setting {
        name: "ATTUNE_SCHEDULE_MIN_INTERVAL_SECS",
        default: Value("1"),
        read_by: &[Api],
        doc: "the shortest time a schedule's `cron` may leave between two runs (among its next 1,000 occurrences): a schedule that would run more often is refused (422 naming `cron`)",
    },
    Setting {
        name: "ATTUNE_SCHEDULES_PER_TOKEN",
        default: Value("100"),
        read_by: &[Api],
        doc: "the most schedules that may run as one token (made or last resumed by it): one more is refused (`409 schedule_limit`)",
    },
    Setting {
        name: "ATTUNE_API_WRITE_TIMEOUT_SECS",
        default: Value("10"),
        read_by: &[Api],
        doc: "a connection whose client takes none of its answer's bytes this long is closed",
    },
    Setting {
        name: "ATTUNE_API_MAX_REQUESTS_PER_CONNECTION",
        default: Value("1000"),
        read_by: &[Api],
        doc: "requests answered on one connection; the last is answered with `Connection: close`",
    },
    Setting {
        name: "ATTUNE_API_SHUTDOWN_TIMEOUT_SECS",
        default: Value("35"),
        read_by: &[Api],
        doc: "on SIGTERM, how long requests in progress may finish before their connections are closed",
    },
    Setting {
        name: "ATTUNE_API_MAX_CONNECTIONS",
        default: Value("1024"),
        read_by: &[Api],
        doc: "connections served at once; when all are taken, the oldest that never carried a valid token makes room, else further ones wait in the listen backlog",
    },
    Setting {
        name: "ATTUNE_API_MAX_BODY_BYTES",
        default: Value("1048576"),
        read_by: &[Api],
        doc: "the largest request body; a larger one is refused with 413 `payload_too_large` before it is read (a declared length) or once it passes the limit",
    },
    Setting {
        name: "ATTUNE_API_LIST_BUDGET_BYTES",
        default: Value("4194304"),
        read_by: &[Api],
        doc: "about the most bytes of rows in one page of `GET /api/v1/executions` (and of attempts in one answer of `GET /api/v1/executions/{id}/chain`, of step executions in one of `GET /api/v1/workflows/{id}`): a page that would be larger holds fewer rows than its `limit` and says where the next starts",
    },
    Setting {
        name: "ATTUNE_WORKER_ACTION_UIDS",
        default: Described("`1900000000-1900065535` when the worker runs as root, else `off`"),
        read_by: &[Worker],
        doc: "the user ids process actions run as, one of its own per running action (group id the same; no passwd entry needed), so that actions cannot read each other's `/proc` entries or signal the worker; `off`: the worker's own user. Packs must be readable by other users",
    },
    Setting {
        name: "ATTUNE_SECRETS_KEY_FILE",
        default: Described("— (no secrets: setting one, or a secret parameter, is refused)"),
        read_by: &[Api, Worker, Cli],
        doc: "a file (mode 0600) holding the key that seals secrets: 32 random bytes as 64 hex digits (`od -An -N32 -tx1 /dev/urandom | tr -d ' \\n'`); the API seals with it, workers open with it",
    },
    Setting {
        name: "ATTUNE_SECRETS_PREVIOUS_KEY_FILES",
        default: Described("— (none)"),
        read_by: &[Api, Worker, Cli],
        doc: "while the key is rotated: files of the keys in force before `ATTUNE_SECRETS_KEY_FILE`, comma-separated, which open what they sealed and seal nothing; `attune secret reseal` seals it all again with the key in force (see the book's security page)",
    },
    Setting {
        name: "ATTUNE_TOKEN_DEFAULT_EXPIRY",
        default: Described("— (never)"),
        read_by: &[Api, Cli],
        doc: "the lifetime of a token created without one (`30d`, `12h`; units s, m, h, d, w), by `attune token create` and `POST /api/v1/tokens`",
    },
    Setting {
        name: "ATTUNE_TOKEN_CACHE_SECS",
        default: Value("10"),
        read_by: &[Api],
        doc: "a verified token is trusted this long without a database read (a revoked token is refused within it; 0 checks every request)",
    },
    Setting {
        name: "ATTUNE_ACTION_CACHE_SECS",
        default: Value("5"),
        read_by: &[Api, Executor],
        doc: "an action is re-read this often (a pack update reaches submissions and scheduling within it; one registered through the API's own `POST /packs` at once)",
    },
    Setting {
        name: "ATTUNE_API_MAX_PARAMETERS_BYTES",
        default: Value("65536"),
        read_by: &[Api],
        doc: "the most bytes an execution's parameters may take as JSON (a larger submission is refused with 413, naming its largest parameter); above ~128 KiB the operating system cannot pass them to an action",
    },
    Setting {
        name: "ATTUNE_API_MAX_PARAMETER_VALUE_BYTES",
        default: Value("32768"),
        read_by: &[Api],
        doc: "the most bytes one parameter's value may take (a string's own bytes, another value's JSON); larger is refused with 413 naming it",
    },
    Setting {
        name: "ATTUNE_API_MAX_CONFIG_BYTES",
        default: Value("16384"),
        read_by: &[Api],
        doc: "the most bytes a submission's `config` may take as JSON (a larger one is refused with 413 naming `config`); every retry of the execution carries a copy of it",
    },
    Setting {
        name: "ATTUNE_API_URL",
        default: Value("http://127.0.0.1:8080"),
        read_by: &[Cli, Bench],
        doc: "the API the CLI and the benchmark talk to (or `--api-url`; the CLI also reads its config file's `api_url`)",
    },
    Setting {
        name: "ATTUNE_CA_CERT",
        default: Described("— (the system's roots)"),
        read_by: &[Cli],
        doc: "a PEM file of CA certificates an `https://` API's certificate may be signed by, besides the system's roots (a private CA)",
    },
    Setting {
        name: "ATTUNE_TOKEN",
        default: Described("—"),
        read_by: &[Cli, Bench],
        doc: "their API token (or `--token`; the CLI also reads its config file's `token`)",
    },
    Setting {
        name: "ATTUNE_FLOORBENCH_DIR",
        default: Value("../shared/floorbench"),
        read_by: &[Bench],
        doc: "where the floor's benchmark (`floorbench`) is; the `workflow` workload pairs each run of its python steps with `floorbench spawn` of the same script from there, when it is built",
    },
    Setting {
        name: "ATTUNE_BENCH_NO_FLOOR",
        default: Described("unset"),
        read_by: &[Bench],
        doc: "set: no floor is measured (`scripts/bench.sh` runs none, the `workflow` workload pairs no run with one)",
    },
    Setting {
        name: "ATTUNE_CONFIG",
        default: Described("`$XDG_CONFIG_HOME/attune/config.json`, else `~/.config/attune/config.json`"),
        read_by: &[Cli],
        doc: "CLI config file: `{\"api_url\": \"...\", \"token\": \"...\"}` (flags and environment win)",
    },
    Setting {
        name: "ATTUNE_WORKER_NAME",
        default: Described("host name and pid"),
        read_by: &[Worker, Cli],
        doc: "unique per worker (`attune up` names its workers `<this or local>-1`, `-2`, …)",
    },
    Setting {
        name: "ATTUNE_WORKER_RUNTIMES",
        default: Value("shell,python,builtin,http"),
        read_by: &[Worker],
        doc: "runtimes the worker offers, comma separated",
    },
    Setting {
        name: "ATTUNE_WORKER_CONCURRENCY",
        default: Value("4"),
        read_by: &[Worker],
        doc: "actions run at once per worker (at least 1)",
    },
    Setting {
        name: "ATTUNE_WORKER_PREFETCH",
        default: Value("16"),
        read_by: &[Worker],
        doc: "the most dispatches a worker takes ahead of its running ones (fewer for slow actions; its slots are concurrency plus the look-ahead)",
    },
    Setting {
        name: "ATTUNE_HEARTBEAT_INTERVAL_SECS",
        default: Value("10"),
        read_by: &[Worker],
        doc: "how often a worker heartbeats; must be shorter than its lease (ATTUNE_HEARTBEAT_MAX_AGE_SECS less a quarter of it, at least 1 s)",
    },
    Setting {
        name: "ATTUNE_WORKER_QUEUE_TTL_SECS",
        default: Value("300"),
        read_by: SERVICES,
        doc: "message TTL of worker queues",
    },
    Setting {
        name: "ATTUNE_WORKER_DRAIN_SECS",
        default: Value("30"),
        read_by: &[Worker],
        doc: "on shutdown, running actions may finish this long, then are killed",
    },
    Setting {
        name: "ATTUNE_WORKER_OUTPUT_LIMIT_BYTES",
        default: Value("65536"),
        read_by: &[Worker],
        doc: "stdout/stderr kept per execution (the tail; an action's `limits.output_kb` replaces it, up to `ATTUNE_ACTION_MAX_OUTPUT_KB`)",
    },
    Setting {
        name: "ATTUNE_WORKER_HTTP_ALLOW",
        default: Described("none: global addresses only"),
        read_by: &[Worker],
        doc: "networks `http` actions may reach besides global addresses, comma-separated CIDRs (`127.0.0.1/32,10.0.0.0/8,::1/128`; an address alone is one host); without it loopback, private, link-local and other non-global destinations are refused (`action_failed`, before any connection), checked on the address a name resolves to",
    },
    Setting {
        name: "ATTUNE_ACTION_MEMORY_MB",
        default: Value("1024"),
        read_by: &[Worker],
        doc: "resident memory of an action's processes together, in MiB, unless its `limits.memory_mb` says otherwise; past it they are killed (`resource_limit`)",
    },
    Setting {
        name: "ATTUNE_ACTION_MAX_MEMORY_MB",
        default: Value("4096"),
        read_by: &[Worker],
        doc: "the most memory a worker grants an action, whatever its `limits.memory_mb` asks",
    },
    Setting {
        name: "ATTUNE_ACTION_CPU_SECS",
        default: Described("none (the timeout bounds the run)"),
        read_by: &[Worker],
        doc: "CPU time of an action's processes together, in seconds, unless its `limits.cpu_secs` says otherwise; past it they are killed (`resource_limit`)",
    },
    Setting {
        name: "ATTUNE_ACTION_MAX_CPU_SECS",
        default: Described("none"),
        read_by: &[Worker],
        doc: "the most CPU time a worker grants an action, whatever its `limits.cpu_secs` asks (also the limit of one that asks none)",
    },
    Setting {
        name: "ATTUNE_ACTION_OPEN_FILES",
        default: Value("1024"),
        read_by: &[Worker],
        doc: "file descriptors per process of an action (`RLIMIT_NOFILE`), unless its `limits.open_files` says otherwise",
    },
    Setting {
        name: "ATTUNE_ACTION_MAX_OPEN_FILES",
        default: Value("65536"),
        read_by: &[Worker],
        doc: "the most file descriptors a worker grants an action (never above the worker's own hard limit)",
    },
    Setting {
        name: "ATTUNE_ACTION_PROCESSES",
        default: Value("256"),
        read_by: &[Worker],
        doc: "the most processes (and threads) of an action run as a user of its own (`RLIMIT_NPROC`, counted per user id, so the run's alone); a fork past it fails in the action",
    },
    Setting {
        name: "ATTUNE_ACTION_FILE_SIZE_MB",
        default: Value("1024"),
        read_by: &[Worker],
        doc: "the largest file an action run as a user of its own may write, in MiB (`RLIMIT_FSIZE`); a write past it raises SIGXFSZ, and a run its signal ends fails as `resource_limit`",
    },
    Setting {
        name: "ATTUNE_ACTION_MAX_OUTPUT_KB",
        default: Value("1024"),
        read_by: &[Worker],
        doc: "the most stdout/stderr a worker keeps of an action, in KiB each, whatever its `limits.output_kb` asks",
    },
    Setting {
        name: "ATTUNE_PYTHON",
        default: Described("`python3`, resolved once at start"),
        read_by: &[Worker],
        doc: "interpreter for the python runtime",
    },
    Setting {
        name: "ATTUNE_WORKER_HEALTH_OVERRIDE_FILE",
        default: Described("—"),
        read_by: &[Worker],
        doc: "JSON file whose fields replace a worker's reported health counters (drain a worker by writing `{\"consecutive_failures\": 10}`)",
    },
    Setting {
        name: "ATTUNE_WORKER_CANCEL_CHECK_SECS",
        default: Value("2"),
        read_by: &[Worker],
        doc: "how often a worker looks in the database for cancellations of what it runs (a lost cancel notice still stops the action within this interval)",
    },
    Setting {
        name: "ATTUNE_HEALTH_WINDOW_SECS",
        default: Value("600"),
        read_by: &[Worker],
        doc: "the recent window a worker's failure rate is measured over",
    },
    Setting {
        name: "ATTUNE_EXECUTOR_PREFETCH",
        default: Value("64"),
        read_by: &[Executor],
        doc: "messages each executor consumer handles at once",
    },
    Setting {
        name: "ATTUNE_WORKER_CACHE_MS",
        default: Value("500"),
        read_by: &[Executor],
        doc: "how long the scheduler reuses its read of the fleet",
    },
    Setting {
        name: "ATTUNE_INFLIGHT_CACHE_MS",
        default: Value("10"),
        read_by: &[Executor],
        doc: "how long the scheduler reuses a read of the executions in flight per worker (adding its own claims), and, while requests wait for room (after a claim that used it up, too), the least it waits before it looks again (longer while the workers' runs are long or untimed, up to 250 ms); at least 5",
    },
    Setting {
        name: "ATTUNE_WORKER_WAIT_SECS",
        default: Value("30"),
        read_by: &[Executor],
        doc: "a request fails as `worker_unavailable` only when no worker that could take work has offered its runtime this long (counted from when the last one left; a draining or restarting worker has not left)",
    },
    Setting {
        name: "ATTUNE_RETRY_ENABLED",
        default: Value("true"),
        read_by: &[Executor],
        doc: "automatic retries on or off",
    },
    Setting {
        name: "ATTUNE_RETRY_BASE_BACKOFF_SECS",
        default: Value("1"),
        read_by: &[Executor],
        doc: "the first retry's backoff (before jitter)",
    },
    Setting {
        name: "ATTUNE_RETRY_MAX_BACKOFF_SECS",
        default: Value("300"),
        read_by: &[Executor],
        doc: "the longest backoff",
    },
    Setting {
        name: "ATTUNE_RETRY_BACKOFF_MULTIPLIER",
        default: Value("2"),
        read_by: &[Executor],
        doc: "each retry's backoff is the previous one times this",
    },
    Setting {
        name: "ATTUNE_RETRY_JITTER_FACTOR",
        default: Value("0.2"),
        read_by: &[Executor],
        doc: "backoffs vary by up to this fraction either way",
    },
    Setting {
        name: "ATTUNE_CIRCUIT_FAILURE_RATE",
        default: Described("unset: no circuit breaker"),
        read_by: &[Executor],
        doc: "a circuit breaker for every action without its own `retry.circuit`: opens at this failure rate (0-1]",
    },
    Setting {
        name: "ATTUNE_CIRCUIT_WINDOW_SECS",
        default: Value("60"),
        read_by: &[Executor],
        doc: "the global circuit breaker's window",
    },
    Setting {
        name: "ATTUNE_CIRCUIT_MIN_EXECUTIONS",
        default: Value("10"),
        read_by: &[Executor],
        doc: "the global circuit breaker opens only after this many executions finished in its window",
    },
    Setting {
        name: "ATTUNE_CIRCUIT_OPEN_SECS",
        default: Value("30"),
        read_by: &[Executor],
        doc: "how long the global circuit breaker stays open before a trial",
    },
    Setting {
        name: "ATTUNE_RETRY_POLL_MS",
        default: Value("100"),
        read_by: &[Executor],
        doc: "how often the retry timer looks for due retries",
    },
    Setting {
        name: "ATTUNE_MONITOR_INTERVAL_SECS",
        default: Value("5"),
        read_by: &[Executor],
        doc: "how often the timeout monitor sweeps",
    },
    Setting {
        name: "ATTUNE_RETENTION_COMPLETED",
        default: Value("7d"),
        read_by: &[Executor],
        doc: "how long a `completed` execution is kept after it finished (`90d`, `12h`, `30m`, `45s`, or `off` for ever); a retry chain goes only when every attempt is past its own status's age",
    },
    Setting {
        name: "ATTUNE_RETENTION_FAILED",
        default: Value("30d"),
        read_by: &[Executor],
        doc: "the same for `failed` executions",
    },
    Setting {
        name: "ATTUNE_RETENTION_TIMEOUT",
        default: Value("30d"),
        read_by: &[Executor],
        doc: "the same for `timeout` executions",
    },
    Setting {
        name: "ATTUNE_RETENTION_CANCELED",
        default: Value("7d"),
        read_by: &[Executor],
        doc: "the same for `canceled` executions",
    },
    Setting {
        name: "ATTUNE_RETENTION_ABANDONED",
        default: Value("30d"),
        read_by: &[Executor],
        doc: "the same for `abandoned` executions",
    },
    Setting {
        name: "ATTUNE_RETENTION_WORKERS",
        default: Value("7d"),
        read_by: &[Executor],
        doc: "how long the row of an `inactive` worker is kept after its last heartbeat; it goes once no unfinished execution names it (finished ones keep its id)",
    },
    Setting {
        name: "ATTUNE_RETENTION_AUDIT",
        default: Value("365d"),
        read_by: &[Executor],
        doc: "how long an audit event (`GET /api/v1/audit`) is kept (`off`: for ever); with `ATTUNE_RETENTION_ARCHIVE` it is moved into `audit_event_archive`",
    },
    Setting {
        name: "ATTUNE_RETENTION_ARCHIVE",
        default: Value("false"),
        read_by: &[Executor],
        doc: "`true`: what retention removes is moved into the table `execution_archive` (same columns) for the operator to move out (`\\copy (DELETE … RETURNING *)`, see the book's operating page); `false`: it is deleted",
    },
    Setting {
        name: "ATTUNE_HISTORY_INTERVAL_SECS",
        default: Value("30"),
        read_by: &[Executor],
        doc: "how often one executor (an advisory lock elects it) counts finished minutes into the statistics rollup and removes history past its age",
    },
    Setting {
        name: "ATTUNE_RETENTION_BATCH",
        default: Value("500"),
        read_by: &[Executor],
        doc: "retry chains examined per retention transaction (each batch is its own short transaction)",
    },
    Setting {
        name: "ATTUNE_SCHEDULING_TIMEOUT_SECS",
        default: Value("30"),
        read_by: &[Executor],
        doc: "`scheduling` (an earlier version's claim) this long is stuck",
    },
    Setting {
        name: "ATTUNE_MONITOR_GRACE_SECS",
        default: Value("30"),
        read_by: &[Executor],
        doc: "slack past the queue TTL (`scheduled`) and past `timeout_seconds` (`running`)",
    },
    Setting {
        name: "ATTUNE_HEARTBEAT_MAX_AGE_SECS",
        default: Value("30"),
        read_by: SERVICES,
        doc: "an older heartbeat makes a worker unhealthy (and, to the monitor, dead); a worker stops its own runs when its last heartbeat that landed is this old less a quarter of it (at least 1 s); set it alike for every service",
    },
    Setting {
        name: "ATTUNE_HEALTH_HEARTBEAT_MAX_AGE_SECS",
        default: Described("—"),
        read_by: SERVICES,
        doc: "the older name of `ATTUNE_HEARTBEAT_MAX_AGE_SECS`, read when only it is set",
    },
    Setting {
        name: "ATTUNE_HEALTH_ENABLED",
        default: Value("true"),
        read_by: SERVICES,
        doc: "health classes on or off (off: every active worker is healthy)",
    },
    Setting {
        name: "ATTUNE_HEALTH_DEGRADED_THRESHOLD",
        default: Value("3"),
        read_by: SERVICES,
        doc: "consecutive worker failures that make it degraded",
    },
    Setting {
        name: "ATTUNE_HEALTH_UNHEALTHY_THRESHOLD",
        default: Value("10"),
        read_by: SERVICES,
        doc: "consecutive worker failures that make it unhealthy",
    },
    Setting {
        name: "ATTUNE_HEALTH_QUEUE_DEPTH_DEGRADED",
        default: Value("50"),
        read_by: SERVICES,
        doc: "queue depth that makes a worker degraded",
    },
    Setting {
        name: "ATTUNE_HEALTH_QUEUE_DEPTH_UNHEALTHY",
        default: Value("100"),
        read_by: SERVICES,
        doc: "queue depth that makes a worker unhealthy",
    },
    Setting {
        name: "ATTUNE_HEALTH_FAILURE_RATE_DEGRADED",
        default: Value("0.3"),
        read_by: SERVICES,
        doc: "failure rate that makes a worker degraded",
    },
    Setting {
        name: "ATTUNE_HEALTH_FAILURE_RATE_UNHEALTHY",
        default: Value("0.7"),
        read_by: SERVICES,
        doc: "failure rate that makes a worker unhealthy",
    },
    Setting {
        name: "ATTUNE_HEALTH_FAILURE_RATE_MIN_EXECUTIONS",
        default: Value("10"),
        read_by: SERVICES,
        doc: "executions before the failure rate counts",
    },
    Setting {
        name: "ATTUNE_HEALTH_PROBATION_SECS",
        default: Value("60"),
        read_by: &[Executor],
        doc: "a worker unhealthy because of its own failures gets one probe execution at a time once its last failure is this old; a success brings it back",
    },
    Setting {
        name: "ATTUNE_METRICS_ADDR",
        default: Described("—"),
        read_by: &[Executor, Worker],
        doc: "serve `GET /metrics` on this address (the API serves it on its own)",
    },
    Setting {
        name: "RUST_LOG",
        default: Value("info,sqlx=warn,lapin=warn"),
        read_by: SERVICES,
        doc: "log filter (`tracing` directives)",
    },
    Setting { name: "ATTUNE_LOG_FORMAT", default: Described("text"), read_by: SERVICES, doc: "`json` for JSON lines" },
    Setting {
        name: "OTEL_EXPORTER_OTLP_ENDPOINT",
        default: Described("— (no traces)"),
        read_by: SERVICES,
        doc: "an OTLP/HTTP (protobuf) collector, such as `http://127.0.0.1:4318`: each execution's spans go to its `/v1/traces` (book: Operating → Tracing). Unset, no span is made or sent. The SDK's own `OTEL_*` variables apply (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_SCHEDULE_DELAY`, ...)",
    },
    Setting {
        name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        default: Described("—"),
        read_by: SERVICES,
        doc: "the traces URL itself (wins over `OTEL_EXPORTER_OTLP_ENDPOINT`; set alone, it turns traces on)",
    },
    Setting {
        name: "OTEL_SERVICE_NAME",
        default: Described("attune-api, attune-executor, attune-worker"),
        read_by: SERVICES,
        doc: "the service name on the spans",
    },
];

/// The setting called `name`. Panics for a name not in the table: reading a setting that is not
/// written down is a bug, caught by the first test that reads it.
pub fn setting(name: &str) -> &'static Setting {
    SETTINGS.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("{name} is not in settings::SETTINGS"))
}

/// Where values come from: the environment, or (in tests) a map.
pub trait Source {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct Environment;

impl Source for Environment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// No variable set: every setting at its default.
pub struct Defaults;

impl Source for Defaults {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// Fixed values (tests, and a process that wants to pin a few settings): the rest unset.
pub struct Vars(pub &'static [(&'static str, &'static str)]);

impl Source for Vars {
    fn var(&self, name: &str) -> Option<String> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    }
}

/// `name` from `source`, or the table's default when it is unset or empty, parsed as `T`; the
/// error names the variable and the value.
pub fn read<T: FromStr>(source: &dyn Source, name: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    let setting = setting(name);
    match source.var(name) {
        Some(value) if !value.trim().is_empty() => parse(name, &value),
        _ => match setting.default {
            Value(default) => parse(name, default)
                .map_err(|e| ConfigError { reason: format!("the default does not parse: {}", e.reason), ..e }),
            Described(what) => panic!("{name} has no literal default ({what}): read it with read_optional"),
        },
    }
}

/// `value`, given for the setting `name`, as `T`; the error names both.
pub fn parse<T: FromStr>(name: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse().map_err(|e: T::Err| ConfigError {
        name: name.to_string(),
        value: value.to_string(),
        reason: e.to_string(),
    })
}

/// `name` from `source` when it is set and not empty (for settings whose default is computed).
pub fn read_optional(source: &dyn Source, name: &str) -> Option<String> {
    let _ = setting(name);
    source.var(name).filter(|v| !v.trim().is_empty())
}

/// `read` from the environment.
pub fn get<T: FromStr>(name: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    read(&Environment, name)
}

fn default_text(setting: &Setting) -> String {
    match setting.default {
        Value(value) => format!("`{value}`"),
        Described(what) => what.to_string(),
    }
}

/// The `--help` text of `process`'s settings.
pub fn help(process: Process) -> String {
    let mut text = String::from("Settings (environment variables; flags, where given, win):\n");
    for setting in SETTINGS.iter().filter(|s| s.read_by.contains(&process)) {
        let default = default_text(setting).replace('`', "");
        text.push_str(&format!("  {} [default: {default}]\n      {}\n", setting.name, setting.doc.replace('`', "")));
    }
    text
}

/// Parses the command line of a binary whose `--help` ends with `process`'s settings.
pub fn parse_with_settings_help<P: clap::Parser>(process: Process) -> P {
    let matches = P::command().after_help(help(process)).get_matches();
    P::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The book's settings table (Markdown).
pub fn markdown_table() -> String {
    let mut table = String::from("| variable | default | read by | |\n|---|---|---|---|\n");
    for setting in SETTINGS {
        let read_by: Vec<&str> = setting.read_by.iter().map(|p| p.as_str()).collect();
        table.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            setting.name,
            default_text(setting),
            read_by.join(", "),
            setting.doc
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_documented() {
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SETTINGS.len(), "a setting is listed twice");
        for setting in SETTINGS {
            assert!(!setting.read_by.is_empty() && !setting.doc.is_empty(), "{}", setting.name);
        }
    }

    #[test]
    fn a_set_value_wins_an_empty_one_falls_back_and_garbage_is_named() {
        let source = Vars(&[
            ("ATTUNE_WORKER_CONCURRENCY", "8"),
            ("ATTUNE_WORKER_PREFETCH", " "),
            ("ATTUNE_RETRY_POLL_MS", "soon"),
        ]);
        assert_eq!(read::<u16>(&source, "ATTUNE_WORKER_CONCURRENCY").unwrap(), 8);
        assert_eq!(read::<u16>(&source, "ATTUNE_WORKER_PREFETCH").unwrap(), 16);
        let error = read::<u64>(&source, "ATTUNE_RETRY_POLL_MS").unwrap_err();
        assert_eq!((error.name.as_str(), error.value.as_str()), ("ATTUNE_RETRY_POLL_MS", "soon"));
        assert_eq!(read_optional(&source, "ATTUNE_WORKER_NAME"), None);
    }

    #[test]
    #[should_panic(expected = "not in settings::SETTINGS")]
    fn reading_an_unlisted_setting_is_a_bug() {
        let _ = read::<u16>(&Defaults, "ATTUNE_NOT_A_SETTING");
    }

    #[test]
    fn help_lists_a_process_s_own_settings() {
        let worker = help(Process::Worker);
        assert!(worker.contains("ATTUNE_WORKER_PREFETCH [default: 16]"), "{worker}");
        assert!(!worker.contains("ATTUNE_EXECUTOR_PREFETCH"), "{worker}");
        assert!(help(Process::Executor).contains("ATTUNE_RETRY_POLL_MS"));
    }
}
