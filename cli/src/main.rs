//! `attune`: the command line for API clients and operators.

mod cmd;
mod commands;
mod reseal;
mod tokens;
mod up;
mod worker_logins;

use attune_cli::{client, output};

use clap::{Parser, Subcommand, ValueEnum};

/// Settings from the config file (`ATTUNE_CONFIG`, else `$XDG_CONFIG_HOME/attune/config.json`, else
/// `~/.config/attune/config.json`): `{"api_url": "...", "token": "..."}`. Flags and environment
/// variables take precedence.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub api_url: Option<String>,
    pub token: Option<String>,
}

impl ConfigFile {
    pub fn path() -> Option<std::path::PathBuf> {
        if let Some(path) = std::env::var_os("ATTUNE_CONFIG") {
            return Some(path.into());
        }
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".config")))?;
        Some(base.join("attune/config.json"))
    }

    pub fn load() -> anyhow::Result<ConfigFile> {
        use anyhow::Context;
        let Some(path) = Self::path() else { return Ok(ConfigFile::default()) };
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).with_context(|| format!("config file {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
            Err(e) => Err(e).with_context(|| format!("config file {}", path.display())),
        }
    }
}

#[derive(Parser)]
#[command(name = "attune", version, about = "attune: run actions, watch executions, operate workers")]
pub struct Cli {
    /// API base URL (else the config file's `api_url`, else http://127.0.0.1:8080)
    #[arg(long, global = true, env = "ATTUNE_API_URL")]
    pub api_url: Option<String>,
    /// API token (else the config file's `token`; create one with `attune token create`)
    #[arg(long, global = true, env = "ATTUNE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Output format
    #[arg(long, short, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Why: recorded with each change this command makes in the audit trail (sent as the
    /// X-Attune-Reason header)
    #[arg(long, global = true, value_name = "TEXT")]
    pub reason: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Apply the database migrations (DATABASE_URL: the role that owns the schema); the
    /// services only check that the schema is current
    Migrate,
    /// Migrate, then run api, executor and workers in this process until interrupted (for development)
    Up {
        /// Number of workers
        #[arg(long, default_value_t = 2)]
        workers: u16,
    },
    /// Submit an execution: attune run core.echo message=hello --wait
    Run {
        /// The action, as pack.name
        action_ref: String,
        /// Parameters as key=value (typed by the action's declaration; JSON for objects and arrays)
        params: Vec<String>,
        /// Wait for the execution (and its automatic retries) to finish; exit non-zero unless it completed
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds
        #[arg(long, default_value_t = 600)]
        wait_timeout: u64,
        /// Sent as the Idempotency-Key header: running the command again with the same key and
        /// parameters within 24 hours gives the first execution back instead of a new one (without
        /// it, the command makes a key of its own, and sends a submission whose answer was lost again
        /// with it)
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Read executions
    #[command(subcommand)]
    Execution(ExecutionCommand),
    /// Read workflow runs (a workflow is run like an action: attune run pack.workflow …)
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// Read workers
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// The packs' webhooks: list them, set a webhook's credential (admin)
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// The packs' rules
    #[command(subcommand)]
    Rule(RuleCommand),
    /// Events received and what each rule made of them; replay one
    #[command(subcommand)]
    Event(EventCommand),
    /// Show the executors' settings in force (retry and health)
    Config,
    /// List and register packs
    #[command(subcommand)]
    Pack(PackCommand),
    /// The registered actions
    #[command(subcommand)]
    Action(ActionCommand),
    /// Manage the secret store: set (the value read from stdin), list (names only), delete
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Manage API tokens and their roles (talks to the database directly: DATABASE_URL)
    #[command(subcommand)]
    Token(TokenCommand),
    /// Which runtimes each worker's database login may serve (talks to the database directly:
    /// DATABASE_URL, the schema's owner): a worker offers, claims and opens the secrets of only
    /// those runtimes' executions
    #[command(subcommand, name = "worker-login")]
    WorkerLogin(WorkerLoginCommand),
    /// Pause an action or a whole runtime (its requests wait until it is resumed; nothing
    /// running is touched), or a workflow run (it starts no new step); needs --reason
    Pause {
        #[arg(value_parser = ["action", "runtime", "run"])]
        kind: String,
        /// The action's ref (pack.name), the runtime's name, or a workflow run's id (it starts no
        /// new step)
        name: String,
    },
    /// Resume a paused action, runtime or workflow run
    Resume {
        #[arg(value_parser = ["action", "runtime", "run"])]
        kind: String,
        name: String,
    },
    /// List what is paused, why, by whom and since when
    Pauses,
    /// Run actions on a schedule: create (a cron expression in a time zone, or one instant),
    /// list, get, pause, resume, delete
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Show an action's concurrency policy, or set one in place of its pack's (--limit N
    /// [--key PARAM], or --no-limit; needs --reason), or --clear it (the pack's is in force again)
    Concurrency {
        /// The action, as pack.name
        action_ref: String,
        /// At most this many of its executions scheduled or running at once
        #[arg(long, conflicts_with_all = ["no_limit", "clear"])]
        limit: Option<i64>,
        /// Count the limit per value of this parameter (with --limit)
        #[arg(long, requires = "limit")]
        key: Option<String>,
        /// No limit, whatever the pack declares
        #[arg(long, conflicts_with = "clear")]
        no_limit: bool,
        /// End the operator's policy
        #[arg(long)]
        clear: bool,
    },
    /// Read the audit trail (admin): who asked for which change, when, and why
    #[command(subcommand)]
    Audit(AuditCommand),
}

/// A schedule as `schedule create` and `schedule edit` take it.
#[derive(clap::Args)]
pub struct ScheduleSpec {
    name: String,
    /// The action, as pack.name
    action_ref: String,
    /// Parameters as key=value (typed by the action's declaration)
    params: Vec<String>,
    /// A cron expression: 5 fields, or 6 with seconds first
    #[arg(long, required_unless_present = "at", conflicts_with = "at")]
    cron: Option<String>,
    /// The IANA time zone the cron expression is read in (default UTC)
    #[arg(long, requires = "cron")]
    timezone: Option<String>,
    /// One instant to run at (RFC 3339)
    #[arg(long)]
    at: Option<String>,
    /// What a look after an outage does with occurrences older than 60 s: skip or once
    #[arg(long, value_parser = ["skip", "once"])]
    catch_up: Option<String>,
    /// Make it paused
    #[arg(long)]
    paused: bool,
}

#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Make a schedule: attune schedule create nightly core.echo message=hi --cron '0 3 * * *'
    /// --timezone Europe/Paris (or --at 2026-12-01T03:00:00Z)
    Create(ScheduleSpec),
    /// Change a schedule: the same arguments as create, all of them (what it ran stays its own)
    Edit(ScheduleSpec),
    /// Run a schedule's action now, once, outside its timing (its next run stays)
    Run {
        name: String,
        /// Wait for the run to finish and exit non-zero unless it completed
        #[arg(long)]
        wait: bool,
        #[arg(long, default_value_t = 600)]
        wait_timeout: u64,
    },
    /// List the schedules with their next and last runs
    List,
    /// Show one schedule
    Get { name: String },
    /// Pause a schedule (no run is created until it is resumed)
    Pause { name: String },
    /// Resume a schedule (from its next occurrence after now)
    Resume { name: String },
    /// Delete a schedule (its executions keep its id)
    Delete { name: String },
}

#[derive(Subcommand)]
pub enum ExecutionCommand {
    /// Show one execution
    Get { id: i64 },
    /// Retry a finished execution by hand (optionally with changed parameters as key=value)
    Retry {
        id: i64,
        /// Parameters to change, as key=value: every other one keeps the retried execution's value
        params: Vec<String>,
        /// Wait for the retry to finish and exit non-zero unless it completed
        #[arg(long)]
        wait: bool,
        #[arg(long, default_value_t = 600)]
        wait_timeout: u64,
    },
    /// Cancel an execution that has not finished (a running one's process group is killed)
    Cancel { id: i64 },
    /// Fail a stuck execution by hand (`operator_failed`, never retried; a running one is stopped)
    Fail {
        id: i64,
        /// Why: recorded in the execution's error
        #[arg(long)]
        reason: String,
    },
    /// Follow an execution and its retries live until the chain ends
    Watch {
        id: i64,
        #[arg(long, default_value_t = 3600)]
        wait_timeout: u64,
    },
    /// Show every attempt of the retry chain an execution belongs to
    Chain { id: i64 },
    /// Print an execution's stdout (on stdout) and stderr (on stderr) as they come, until it
    /// ends; exits 0 if it completed, 2 if it ended otherwise, 1 if the stream ended first.
    /// Control characters but newline and tab are shown escaped (`\x1b`): an action's output
    /// cannot drive the terminal
    Tail {
        id: i64,
        /// Print the output as it is, control characters included (for a file or a pipe)
        #[arg(long)]
        raw: bool,
    },
    /// Say why an execution was or was not retried: its failure kind, its retry count, the
    /// policy in force and the rule that decided
    Explain { id: i64 },
    /// List executions, newest first
    List {
        #[arg(long)]
        status: Option<String>,
        /// Executions of this action, as pack.name
        #[arg(long, visible_alias = "action-ref")]
        action: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: i64,
        #[arg(long, default_value_t = 0)]
        offset: i64,
    },
    /// Retry, cancel or fail every execution a filter selects (at most --limit, oldest first),
    /// each by its own rules; --dry-run shows which, changing nothing. Needs --reason.
    Bulk(BulkArgs),
}

/// What `attune execution bulk` does, and to which executions.
#[derive(clap::Args)]
pub struct BulkArgs {
    /// retry, cancel or fail
    #[arg(value_parser = ["retry", "cancel", "fail"])]
    action: String,
    #[arg(long)]
    status: Option<String>,
    /// The action, as pack.name
    #[arg(long, visible_alias = "action")]
    action_ref: Option<String>,
    #[arg(long)]
    failure_kind: Option<String>,
    /// RFC 3339 time
    #[arg(long)]
    created_after: Option<String>,
    /// RFC 3339 time
    #[arg(long)]
    created_before: Option<String>,
    /// The attempts of this execution's retry chain (its first attempt's id)
    #[arg(long)]
    chain_root: Option<i64>,
    #[arg(long, default_value_t = 100)]
    limit: i64,
    /// Show which executions it would act on; change nothing
    #[arg(long)]
    dry_run: bool,
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// List audit events, newest first
    List {
        /// Only this token's (its name) or this actor's (`cli:<user>`)
        #[arg(long)]
        actor: Option<String>,
        /// Only this route (`/api/v1/executions/{id}/cancel`)
        #[arg(long)]
        route: Option<String>,
        /// Only what made or changed this (`execution:42`)
        #[arg(long)]
        target: Option<String>,
        /// Only events at or after this time (RFC 3339)
        #[arg(long)]
        since: Option<String>,
        /// At most this many
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Subcommand)]
pub enum WorkflowCommand {
    /// Show a run and each step's state, attempts and timing
    Get { id: i64 },
    /// Show a run as a tree: each step, each of its items' executions, their states and errors
    /// (the first 100 of each step's executions unless --all)
    Tree {
        id: i64,
        /// Only this step
        #[arg(long)]
        step: Option<String>,
        /// Every execution of each step, page after page
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
pub enum WebhookCommand {
    /// List webhooks, their kind of proof and whether a credential is set
    List,
    /// Set a webhook's credential: a token webhook gets a new token (shown once), a signed one
    /// (github, stripe, hmac) takes its key from stdin
    Credential {
        name: String,
        /// Read the value (a signing key, or a token of your own) from stdin
        #[arg(long)]
        value_stdin: bool,
    },
}

#[derive(Subcommand)]
pub enum RuleCommand {
    /// List rules: trigger, action, enabled
    List,
    /// Make a rule from a file written as a pack's rules/NAME.yaml; it becomes local.NAME
    Create { file: std::path::PathBuf },
    /// Enable a rule (a pack's registration keeps it enabled)
    Enable { rule: String },
    /// Disable a rule (a pack's registration keeps it disabled)
    Disable { rule: String },
    /// Delete a rule made with `rule create` (a pack's rule is disabled instead)
    Delete { rule: String },
}

#[derive(Subcommand)]
pub enum EventCommand {
    /// List events, newest first, with each rule's answer
    List {
        /// Only events of this trigger (webhook.NAME)
        #[arg(long)]
        trigger: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Show an event: its payload and what each rule made of it
    Get { id: i64 },
    /// Record an event's payload again as a new event, answered by the rules as they are now
    Replay { id: i64 },
}

#[derive(Subcommand)]
pub enum WorkerCommand {
    /// List workers with their health class, queue depth and heartbeat age
    List,
    /// Drain a worker: it finishes what it runs and holds, and is given nothing new
    Drain { name: String },
    /// Undrain a worker: it is given work again
    Undrain { name: String },
}

#[derive(Subcommand)]
pub enum SecretCommand {
    /// Set a secret (admin): its value is read from stdin (never the command line, which other
    /// users of the machine can see), one trailing newline dropped
    Set {
        name: String,
        /// The actions that may be given it, comma-separated: action refs (pack.name), packs
        /// (pack) or * (any); required for a new secret, kept when omitted
        #[arg(long, value_delimiter = ',')]
        users: Option<Vec<String>>,
    },
    /// The secrets' names, users and when they were set (operator); never a value
    List,
    /// Delete a secret (admin)
    Delete { name: String },
    /// Seal every stored secret and every execution's sealed parameters again with the key in
    /// force (ATTUNE_SECRETS_KEY_FILE), opening them with it or a previous one
    /// (ATTUNE_SECRETS_PREVIOUS_KEY_FILES): the step of a key rotation after which the previous
    /// keys can go. Talks to the database directly (DATABASE_URL, the schema's owner)
    Reseal,
}

#[derive(Subcommand)]
pub enum PackCommand {
    /// List the registered packs: version, actions, where each was registered from
    List,
    /// Register (or update) the pack in PATH (a directory under the API's ATTUNE_PACKS_DIR)
    Register {
        path: std::path::PathBuf,
        /// Take the pack's ref over from the directory it is registered from
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub enum ActionCommand {
    /// List actions: runtime, timeout, retries (of one pack with --pack)
    List {
        #[arg(long)]
        pack: Option<String>,
    },
    /// Show an action: its parameters, retry policy, concurrency and circuit
    Get { action_ref: String },
}

#[derive(Subcommand)]
pub enum WorkerLoginCommand {
    /// Let a worker login serve these runtimes (shell, python, builtin, http)
    Allow {
        login: String,
        #[arg(required = true)]
        runtimes: Vec<String>,
    },
    /// Take these runtimes back from a worker login (all of them when none is named); its
    /// workers advertise them no more from their next heartbeat, and claim none of their runs
    Deny { login: String, runtimes: Vec<String> },
    /// Every login's runtimes
    List,
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it alone on stdout (it is shown this once)
    Create {
        #[arg(long)]
        name: String,
        /// What it may do (required: there is no default): read (every GET but the token list),
        /// operator (also submit, retry, cancel and fail executions) or admin (also register
        /// packs and manage tokens)
        #[arg(long, value_parser = parse_role)]
        role: attune_common::db::token::Role,
        /// Make it expire after this long: a number and a unit, s, m, h, d or w (30d, 12h), or
        /// never; without it, ATTUNE_TOKEN_DEFAULT_EXPIRY (unset: never)
        #[arg(long, value_name = "DURATION", value_parser = tokens::parse_expires_in)]
        expires_in: Option<tokens::Lifetime>,
    },
    /// List the tokens: id, name, role, created, expires, revoked (never the tokens themselves)
    List,
    /// Revoke a token by its id (digits) or name (a name several live tokens share is refused)
    Revoke {
        #[arg(value_name = "NAME-OR-ID")]
        token: String,
    },
}

fn parse_role(text: &str) -> Result<attune_common::db::token::Role, String> {
    text.parse().map_err(|e: attune_common::db::token::UnknownRole| e.to_string())
}

fn main() {
    // `attune supervise ...`: this process supervises one action of `attune up`'s workers
    attune_worker::supervise::run_if_asked();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(run());
}

async fn run() {
    use attune_common::settings::parse_with_settings_help;
    let cli = parse_with_settings_help::<Cli>(attune_common::settings::Process::Cli);
    let code = match commands::dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
