//! The pack format: `pack.yaml` plus `actions/*.yaml`, parsed from text and validated. Reading
//! the files is the caller's (`attune_common::pack::load_pack`); this module only decides.
//!
//! An invalid file names the file, the field and the reason, e.g.
//! `packs/core/actions/echo.yaml: field 'timeout_seconds': must be at least 1`.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::failure::FailureKind;
use crate::params::{self, ParamSpecs};

/// Runtimes a worker may offer. `builtin` actions run inside the worker without a process
/// (`core.noop`, for measuring the platform itself); `http` actions make one HTTP request,
/// described by their `http:` block, from the worker.
pub const RUNTIMES: [&str; 4] = ["shell", "python", "builtin", "http"];
pub const HTTP_METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
pub const BUILTIN_ENTRYPOINTS: [&str; 1] = ["noop"];

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PackManifest {
    #[serde(rename = "ref")]
    pub pack_ref: String,
    pub version: String,
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ActionSpec {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub runtime: String,
    /// The script, relative to the pack directory (the builtin's name for `builtin`; none for
    /// `http`).
    #[serde(default)]
    pub entrypoint: String,
    /// Overrides the global default (300 s) when set.
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
    /// Retries after the first attempt; -1: unlimited (still capped in delay, stopped by a
    /// cancel and held back by an open circuit).
    #[serde(default)]
    pub max_retries: Option<i32>,
    #[serde(default)]
    pub parameters: ParamSpecs,
    #[serde(default)]
    pub retry: Option<RetryPolicy>,
    /// The request of a `runtime: http` action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSpec>,
    /// What one run may take (see `ActionLimits`); unset fields take the worker's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ActionLimits>,
    /// How long this action's finished executions are kept, per terminal status (`completed:
    /// 1d`, `failed: 90d`, `canceled: off`), over the executors' `ATTUNE_RETENTION_*` for the
    /// statuses it names (see `attune_core::retention`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<BTreeMap<String, String>>,
    /// At most `limit` executions of the action scheduled or running at once, per value of the
    /// parameter `key` if given (see `ConcurrencySpec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencySpec>,
}

/// An action's concurrency policy: at most `limit` of its executions scheduled or running at once,
/// counted per value of the parameter `key` when it names one (`{limit: 1, key: host}`: one at a
/// time per host). What waits beyond it stays `requested`, in its order; it is never failed for it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// At least 1, at most `MOST_CONCURRENT`.
    pub limit: i64,
    /// A declared, non-secret parameter: its value (as text; absent counts as one value of its
    /// own) partitions the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Whether an HTTP header of this name carries credentials (case-insensitive): `Authorization`,
/// cookies, and any name that speaks of a token, an API, access or private key, a secret, a
/// password, a session or authentication. Their values are never answered: a response's are stored `[redacted]`, and an
/// action's shown so.
pub fn is_sensitive_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    const WORDS: [&str; 16] = [
        "auth",
        "cookie",
        "token",
        "secret",
        "password",
        "passwd",
        "session",
        "apikey",
        "api-key",
        "api_key",
        "access-key",
        "private-key",
        "subscription-key",
        "functions-key",
        "signature",
        "credential",
    ];
    WORDS.iter().any(|word| name.contains(word))
}

/// The largest concurrency limit an action may declare or be given.
pub const MOST_CONCURRENT: i64 = 100_000;

impl ConcurrencySpec {
    /// The policy's problem against the action's parameters, as (field, reason).
    pub fn check(&self, parameters: &ParamSpecs) -> Result<(), (&'static str, String)> {
        if !(1..=MOST_CONCURRENT).contains(&self.limit) {
            return Err(("limit", format!("must be between 1 and {MOST_CONCURRENT}, got {}", self.limit)));
        }
        if let Some(key) = &self.key {
            let Some(spec) = parameters.get(key) else {
                let declared: Vec<&str> = parameters.keys().map(String::as_str).collect();
                return Err((
                    "key",
                    format!("'{key}' is not a parameter of the action (it declares: {})", declared.join(", ")),
                ));
            };
            if spec.secret {
                return Err(("key", format!("'{key}' is a secret parameter: its stored value cannot be compared")));
            }
        }
        Ok(())
    }
}

impl ActionSpec {
    /// The ages of its `retention` block, each with its status; the error names the field.
    pub fn retention_ages(&self) -> Result<Vec<(crate::ExecutionStatus, crate::retention::Age)>, (String, String)> {
        let Some(block) = &self.retention else { return Ok(Vec::new()) };
        let mut ages = Vec::new();
        for (status, age) in block {
            let field = format!("retention.{status}");
            let known: Vec<&str> = crate::ExecutionStatus::TERMINAL.iter().map(|s| s.as_str()).collect();
            let Some(parsed) = crate::ExecutionStatus::parse(status).filter(|s| s.is_terminal()) else {
                return Err((
                    "retention".into(),
                    format!("'{status}' is not a finished status (expected one of: {})", known.join(", ")),
                ));
            };
            let age = age.parse::<crate::retention::Age>().map_err(|reason| (field, reason))?;
            ages.push((parsed, age));
        }
        Ok(ages)
    }

    /// The retries after the first attempt this action allows: `max_retries`, else Tasker's
    /// `retry.max_attempts` less the first attempt, else none; none at all with
    /// `retry.retryable: false`. -1 is unlimited.
    pub fn max_retries_in_force(&self) -> i32 {
        let retry = self.retry.as_ref();
        if retry.and_then(|r| r.retryable) == Some(false) {
            return 0;
        }
        match (self.max_retries, retry.and_then(|r| r.max_attempts)) {
            (Some(retries), _) => retries,
            (None, Some(attempts)) => (attempts - 1).max(0),
            (None, None) => 0,
        }
    }

    /// What is allowed but most likely not meant, in words naming the field.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for (name, value) in self.http.iter().flat_map(|http| &http.headers) {
            let literal = value.split("{{").next().unwrap_or_default();
            if is_sensitive_header(name) && !value.contains("{{") && !literal.trim().is_empty() {
                warnings.push(format!(
                    "field 'http.headers.{name}': a credential written in the pack is readable by whoever reads \
                     the pack; take it from a secret parameter ({{{{ param }}}} with 'secret: true', or a stored secret)"
                ));
            }
        }
        let retry = self.retry.as_ref();
        if retry.and_then(|r| r.max_attempts) == Some(0) {
            warnings.push(
                "field 'retry.max_attempts': 0 attempts is a configuration error: the first attempt still runs, and \
                 nothing after it (write max_attempts: 1 to say so)"
                    .to_string(),
            );
        }
        if retry.and_then(|r| r.retryable) == Some(false) && retry.and_then(|r| r.max_attempts).is_some_and(|a| a > 1) {
            warnings.push(
                "field 'retry.retryable': false, so retry.max_attempts above 1 has no effect: only the first attempt runs"
                    .to_string(),
            );
        }
        warnings
    }
}

/// The request an HTTP action makes. `{{ name }}` in `url`, `headers` and `body` is replaced by
/// the parameter `name` (URL-encoded in the URL, JSON-encoded in a JSON body, as text in a
/// header; see `crate::template`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    #[serde(default = "HttpSpec::default_method")]
    pub method: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A mapping or list is sent as JSON; a string is sent as written (JSON-encoding the values
    /// unless a `Content-Type` header says it is not JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
}

impl HttpSpec {
    fn default_method() -> String {
        "GET".to_string()
    }
}

/// The optional `limits:` block of an action: what one run of it may take. Each field unset takes
/// the worker's default (`ATTUNE_ACTION_MEMORY_MB`, `ATTUNE_ACTION_CPU_SECS`,
/// `ATTUNE_ACTION_OPEN_FILES`, `ATTUNE_WORKER_OUTPUT_LIMIT_BYTES`); an action may ask for less or
/// more, and the worker grants at most its maximum (`ATTUNE_ACTION_MAX_*`; see `LimitSettings`).
///
/// - `memory_mb`: the resident memory of the action's processes together, in MiB; passing it
///   kills them and fails the run as `resource_limit`.
/// - `cpu_secs`: the CPU time of the action's processes together, in seconds; the same.
/// - `open_files`: file descriptors per process (`RLIMIT_NOFILE`); one more cannot be opened, and
///   the action fails with its own error.
/// - `output_kb`: stdout and stderr kept, each, in KiB; more only cuts the output (its tail is
///   kept), it does not fail the run.
///
/// Written as signed numbers so that a negative one is refused naming its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ActionLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_secs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_kb: Option<i64>,
}

/// The bounds of each field of `limits:` (inclusive): below them an action could not start
/// (an interpreter alone takes about 10 MiB and 3 descriptors are stdin, stdout and stderr),
/// above them the number means nothing on a real host.
pub const LIMIT_BOUNDS: [(&str, i64, i64); 4] = [
    ("memory_mb", 16, 1 << 20),
    ("cpu_secs", 1, 366 * 24 * 3600),
    ("open_files", 16, 1 << 20),
    ("output_kb", 1, 1 << 20),
];

/// A worker's defaults and maximums for action limits (read from `ATTUNE_ACTION_*` and
/// `ATTUNE_WORKER_OUTPUT_LIMIT_BYTES` by the worker). `None` for CPU time: no limit (the
/// action's timeout still bounds its run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSettings {
    pub memory_mb: u64,
    pub max_memory_mb: u64,
    pub cpu_secs: Option<u64>,
    pub max_cpu_secs: Option<u64>,
    pub open_files: u64,
    pub max_open_files: u64,
    pub output_bytes: u64,
    pub max_output_bytes: u64,
}

/// The limits one run is held to: what the action asked, else the worker's default, at most the
/// worker's maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory_mb: u64,
    pub cpu_secs: Option<u64>,
    pub open_files: u64,
    pub output_bytes: u64,
}

impl LimitSettings {
    /// The limits in force for an action that asked for `asked` (a value the pack check let pass).
    pub fn in_force(&self, asked: Option<&ActionLimits>) -> Limits {
        let asked = asked.copied().unwrap_or_default();
        let positive = |value: Option<i64>| value.and_then(|v| u64::try_from(v).ok()).filter(|v| *v > 0);
        let capped = |value: u64, max: u64| value.min(max.max(1));
        Limits {
            memory_mb: capped(positive(asked.memory_mb).unwrap_or(self.memory_mb), self.max_memory_mb),
            cpu_secs: match (positive(asked.cpu_secs).or(self.cpu_secs), self.max_cpu_secs) {
                (Some(secs), Some(max)) => Some(capped(secs, max)),
                (None, Some(max)) => Some(max.max(1)),
                (secs, None) => secs,
            },
            open_files: capped(positive(asked.open_files).unwrap_or(self.open_files), self.max_open_files),
            output_bytes: capped(
                positive(asked.output_kb).map_or(self.output_bytes, |kb| kb.saturating_mul(1024)),
                self.max_output_bytes,
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackoffKind {
    Fixed,
    Linear,
    Exponential,
}

/// The optional `retry:` block of an action. Every field falls back to the global `RetrySettings`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_delay_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
    /// Failure kinds retried automatically (default: the retriable kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<FailureKind>>,
    /// Exit codes that count as transient failures besides 75.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_codes: Option<Vec<i32>>,
    /// `false`: an execution that may have started is not retried after its worker vanished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// Ordered rules: the first whose `when` matches a failure decides it (`then`); a failure no
    /// rule matches is decided by `on` and `max_retries` as without rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<RetryRule>>,
    /// Tasker's form: total attempts, the first included (`max_attempts: 3` = `max_retries: 2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i32>,
    /// Tasker's form: `false` never retries (the first attempt always runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// A circuit breaker for this action (see `crate::circuit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitSpec>,
}

/// One retry rule: `when` a failure matches, `then` retry or fail.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryRule {
    pub when: RuleWhen,
    pub then: RuleThen,
}

/// What a rule matches. It matches a failure when **any** listed condition holds: its exit code is
/// one of `exit_codes`, its kind one of `failure_kinds`, its HTTP status one of `http_status`, or
/// the value at `result.path` of its result is the one given. Structured data only, never text.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleWhen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_codes: Option<Vec<i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_kinds: Option<Vec<FailureKind>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<Vec<i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ResultMatch>,
}

/// A value in the action's result: `path` is keys and array indices joined by `.`
/// (`error.code`, `items.0.state`); `equals` one value or `in` a list of them (JSON equality).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResultMatch {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
}

impl ResultMatch {
    /// The path's segments.
    pub fn segments(&self) -> Vec<&str> {
        self.path.split('.').collect()
    }

    /// The values that match.
    pub fn values(&self) -> Vec<&Value> {
        self.equals.iter().chain(self.one_of.iter().flatten()).collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleDo {
    Retry,
    Fail,
}

/// What a matching rule decides. `retry` with its own `attempts` (total, the first included;
/// without it the action's `max_retries` applies) and its own backoff (each unset field falls
/// back to the action's `retry:` block, then to the global settings).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleThen {
    #[serde(rename = "do")]
    pub action: RuleDo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
}

/// A circuit breaker: when at least `min_executions` of the action finished in the last
/// `window_secs` and at least `failure_rate` of them failed, the circuit opens for `open_secs`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CircuitSpec {
    pub failure_rate: f64,
    pub window_secs: f64,
    pub min_executions: i32,
    pub open_secs: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoadedAction {
    pub action_ref: String,
    pub spec: ActionSpec,
    /// `ActionSpec::warnings`, prefixed with the file.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoadedPack {
    pub manifest: PackManifest,
    pub path: PathBuf,
    pub actions: Vec<LoadedAction>,
    pub workflows: Vec<LoadedWorkflow>,
    /// `webhooks/*.yaml` and `rules/*.yaml` (`crate::rules`).
    pub webhooks: Vec<crate::rules::WebhookSpec>,
    pub rules: Vec<LoadedRule>,
}

/// A rule of a pack (`rules/NAME.yaml`): its ref is `pack.name`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedRule {
    pub rule_ref: String,
    pub file: PathBuf,
    pub spec: crate::rules::RuleSpec,
}

/// A workflow of a pack (`workflows/NAME.yaml`, `crate::workflow`): registered as an action of
/// runtime `workflow`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedWorkflow {
    pub workflow_ref: String,
    /// The file it came from, for the registration's errors.
    pub file: PathBuf,
    pub spec: crate::workflow::WorkflowSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {}{reason}", file.display(), field.as_ref().map(|f| format!("field '{f}': ")).unwrap_or_default())]
pub struct PackError {
    pub file: PathBuf,
    pub field: Option<String>,
    pub reason: String,
}

impl PackError {
    pub fn new(file: &Path, field: Option<&str>, reason: impl Into<String>) -> Self {
        PackError { file: file.to_path_buf(), field: field.map(str::to_string), reason: reason.into() }
    }
}

/// Parses a YAML file's `text`; a syntax or shape error names `file` and, where serde says which,
/// the field.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(file: &Path, text: &str) -> Result<T, PackError> {
    serde_yaml_ng::from_str(text).map_err(|e| {
        let message = without_content(&e.to_string());
        // serde names the field in "missing field `x`" / "unknown field `x`"; lift it out so the
        // error has the same shape as the semantic checks below.
        let field = message.split('`').nth(1).filter(|_| message.contains(" field `"));
        // and where it says where the value was ("auth: unknown variant …"), that path
        let at = message.split_once(": ").map(|(path, _)| path).filter(|path| {
            !path.is_empty()
                && path.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '[' | ']'))
        });
        PackError::new(file, field.or(at), message.clone())
    })
}

/// A parser's message with the file's own text taken out: serde quotes the value it could not
/// use (`invalid type: string "…", expected i32`), and an error answered to an API client must
/// name the file, the field and the reason, never echo what the file holds. What stays: the kind
/// of value found, what was expected, field names and the position.
pub fn without_content(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    for marker in ["invalid type: ", "invalid value: ", "unknown variant "] {
        if let Some(at) = rest.find(marker) {
            let (before, after) = rest.split_at(at + marker.len());
            out.push_str(before);
            // the kind of value (`string`, `integer`, …) is the first word; the value follows it
            let kind_end = if marker == "unknown variant " { 0 } else { after.find([' ', ',']).unwrap_or(after.len()) };
            out.push_str(&after[..kind_end]);
            let skip_to = after.find(", expected").unwrap_or(after.len());
            rest = &after[skip_to.max(kind_end)..];
            if marker == "unknown variant " {
                out.truncate(out.len() - 1);
            }
        }
    }
    out.push_str(rest);
    out
}

pub fn is_identifier(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn refuse_nul(file: &Path, parsed: &impl Serialize) -> Result<(), PackError> {
    let value = serde_json::to_value(parsed).map_err(|e| PackError::new(file, None, e.to_string()))?;
    match crate::params::nul_path(&value, "") {
        Some(field) => Err(PackError::new(file, Some(&field), "must not contain a NUL character")),
        None => Ok(()),
    }
}

/// Parses and checks `pack.yaml`.
pub fn parse_manifest(file: &Path, text: &str) -> Result<PackManifest, PackError> {
    let manifest: PackManifest = parse_yaml(file, text)?;
    refuse_nul(file, &manifest)?;
    if !is_identifier(&manifest.pack_ref) {
        return Err(PackError::new(file, Some("ref"), "must be lowercase letters, digits, '_' or '-'"));
    }
    Ok(manifest)
}

/// Parses and checks one action file of the pack in `pack_dir`. `entrypoint_exists` answers
/// whether a path (already checked to lie inside the pack) names a file.
pub fn parse_action(
    pack_dir: &Path,
    file: &Path,
    text: &str,
    entrypoint_exists: impl Fn(&Path) -> bool,
) -> Result<ActionSpec, PackError> {
    let spec: ActionSpec = parse_yaml(file, text).map_err(|e| flattened_parameters(file, text).unwrap_or(e))?;
    refuse_nul(file, &spec)?;
    validate_action(pack_dir, file, &spec, entrypoint_exists)?;
    Ok(spec)
}

/// The error for an action file whose `parameters:` lost its indentation (a copy from a page
/// that flattened it: `parameters:` empty, and a parameter's `type:` and `required:` at the top
/// level), showing the form it should have; `None` for any other file.
fn flattened_parameters(file: &Path, text: &str) -> Option<PackError> {
    let serde_yaml_ng::Value::Mapping(top) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text).ok()? else {
        return None;
    };
    let key = |name: &str| serde_yaml_ng::Value::String(name.to_string());
    let parameters_empty = top.get(key("parameters")).is_some_and(serde_yaml_ng::Value::is_null);
    let field_at_top = ["type", "required", "default", "secret"].iter().any(|f| top.contains_key(key(f)));
    if !parameters_empty || !field_at_top {
        return None;
    }
    // the parameters' names: the empty keys after `parameters:` that no action field has
    const FIELDS: [&str; 4] = ["type", "required", "default", "secret"];
    let names: Vec<String> = top
        .iter()
        .skip_while(|(k, _)| k.as_str() != Some("parameters"))
        .skip(1)
        .filter(|(k, v)| v.is_null() && k.as_str().is_some_and(|k| !FIELDS.contains(&k)))
        .filter_map(|(k, _)| k.as_str().map(str::to_string))
        .collect();
    let example = names.first().map_or("url", String::as_str);
    let reason = format!(
        "the parameters are not indented under 'parameters:' (their fields sit at the top level: a copy that lost \
         its indentation?); write each parameter indented under it, and its fields under the parameter:\n\
         parameters:\n  {example}:\n    type: string\n    required: true"
    );
    Some(PackError::new(file, Some("parameters"), reason))
}

fn validate_action(
    pack_dir: &Path,
    file: &Path,
    spec: &ActionSpec,
    entrypoint_exists: impl Fn(&Path) -> bool,
) -> Result<(), PackError> {
    let fail = |field: &str, reason: String| Err(PackError::new(file, Some(field), reason));
    if !is_identifier(&spec.name) {
        return fail("name", "must be lowercase letters, digits, '_' or '-'".into());
    }
    if !RUNTIMES.contains(&spec.runtime.as_str()) {
        return fail(
            "runtime",
            format!("unknown runtime '{}' (expected one of: {})", spec.runtime, RUNTIMES.join(", ")),
        );
    }
    if spec.runtime == "http" {
        if !spec.entrypoint.is_empty() {
            return fail("entrypoint", "an http action has no entrypoint: its request is the 'http' block".into());
        }
        let Some(http) = &spec.http else {
            return fail("http", "missing: an http action needs an 'http' block with at least 'url'".into());
        };
        validate_http(http, &spec.parameters).or_else(|(field, reason)| fail(&format!("http.{field}"), reason))?;
    } else if spec.http.is_some() {
        return fail(
            "http",
            format!("only an http action has an 'http' block (this one's runtime is '{}')", spec.runtime),
        );
    } else if spec.entrypoint.is_empty() {
        return fail("entrypoint", "missing field `entrypoint`".into());
    } else if spec.runtime == "builtin" {
        if !BUILTIN_ENTRYPOINTS.contains(&spec.entrypoint.as_str()) {
            return fail(
                "entrypoint",
                format!("unknown builtin '{}' (expected one of: {})", spec.entrypoint, BUILTIN_ENTRYPOINTS.join(", ")),
            );
        }
    } else {
        let relative = Path::new(&spec.entrypoint);
        if relative.is_absolute() || relative.components().any(|c| matches!(c, Component::ParentDir)) {
            return fail("entrypoint", "must be a path inside the pack directory".into());
        }
        if !entrypoint_exists(&pack_dir.join(relative)) {
            return fail(
                "entrypoint",
                format!("file '{}' not found in the pack (a symbolic link must not lead outside it)", spec.entrypoint),
            );
        }
    }
    if let Some(timeout) = spec.timeout_seconds
        && timeout < 1
    {
        return fail("timeout_seconds", "must be at least 1".into());
    }
    if let Some(max_retries) = spec.max_retries
        && !(-1..=100).contains(&max_retries)
    {
        return fail("max_retries", "must be between 0 and 100, or -1 for unlimited".into());
    }
    if spec.max_retries.is_some() && spec.retry.as_ref().is_some_and(|r| r.max_attempts.is_some()) {
        return fail(
            "max_retries",
            "both 'max_retries' and 'retry.max_attempts' are given; give one (max_attempts counts the first attempt)"
                .into(),
        );
    }
    for (name, param) in &spec.parameters {
        if let Err(e) = params::check_spec(name, param) {
            return fail(&format!("parameters.{name}.default"), e.reason);
        }
    }
    if let Some(retry) = &spec.retry {
        validate_retry(retry).or_else(|(field, reason)| fail(&format!("retry.{field}"), reason))?;
    }
    if let Err((field, reason)) = spec.retention_ages() {
        return fail(&field, reason);
    }
    if let Some(concurrency) = &spec.concurrency
        && let Err((field, reason)) = concurrency.check(&spec.parameters)
    {
        return fail(&format!("concurrency.{field}"), reason);
    }
    if let Some(limits) = &spec.limits {
        if spec.runtime == "builtin" || spec.runtime == "http" {
            return fail(
                "limits",
                format!("a {} action runs inside the worker, without a process to limit", spec.runtime),
            );
        }
        let asked = [limits.memory_mb, limits.cpu_secs, limits.open_files, limits.output_kb];
        for ((name, least, most), value) in LIMIT_BOUNDS.into_iter().zip(asked) {
            if let Some(value) = value
                && !(least..=most).contains(&value)
            {
                return fail(&format!("limits.{name}"), format!("must be between {least} and {most}, got {value}"));
            }
        }
    }
    Ok(())
}

fn validate_http(http: &HttpSpec, parameters: &ParamSpecs) -> Result<(), (String, String)> {
    let declared = |field: &str, names: Vec<String>| match names.into_iter().find(|n| !parameters.contains_key(n)) {
        Some(name) => Err((field.to_string(), format!("'{{{{ {name} }}}}' names no declared parameter"))),
        None => Ok(()),
    };
    let owned = |names: Vec<&str>| names.into_iter().map(str::to_string).collect::<Vec<_>>();
    if !HTTP_METHODS.contains(&http.method.as_str()) {
        return Err((
            "method".into(),
            format!("unknown method '{}' (expected one of: {})", http.method, HTTP_METHODS.join(", ")),
        ));
    }
    if !(http.url.starts_with("http://") || http.url.starts_with("https://")) {
        return Err(("url".into(), "must start with http:// or https://".into()));
    }
    let names = crate::template::names(&http.url).map_err(|e| ("url".to_string(), e))?;
    // The host is written in the pack: a parameter anywhere before it or in it could choose the
    // destination (`http://@{{ host }}`, `http://{{ user }}@h`, `http://h{{ rest }}`). The
    // authority runs to the first '/', '?', '#' or '\\' (which URL parsers also take for a '/');
    // a parameter may fill the port (its value is URL-encoded, so it cannot leave it).
    let rest = http.url.split_once("://").map_or("", |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len())];
    let (userinfo, host_port) = authority.rsplit_once('@').unwrap_or(("", authority));
    let host = match host_port.strip_prefix('[') {
        Some(ipv6) => ipv6.split_once(']').map_or(host_port, |(address, _)| address),
        None => host_port.split(':').next().unwrap_or(""),
    };
    if userinfo.contains("{{") || host.contains("{{") || host.contains("}}") {
        return Err((
            "url".into(),
            format!(
                "the host must be written in the URL, not taken from a parameter: '{authority}' may hold a \
                 '{{{{ }}}}' in its port only"
            ),
        ));
    }
    if host.is_empty() {
        return Err(("url".into(), "the URL must name its host, e.g. https://api.example.com/path".into()));
    }
    declared("url", owned(names))?;
    for (name, value) in &http.headers {
        let field = format!("headers.{name}");
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
            return Err((field, "is not a valid header name".into()));
        }
        if value.contains(['\r', '\n']) {
            return Err((field, "must not contain a line break".into()));
        }
        declared(&field, owned(crate::template::names(value).map_err(|e| (field.clone(), e))?))?;
    }
    if let Some(body) = &http.body {
        declared("body", crate::template::json_names(body).map_err(|e| ("body".to_string(), e))?)?;
    }
    Ok(())
}

pub(crate) fn validate_retry(retry: &RetryPolicy) -> Result<(), (String, String)> {
    validate_retry_fields(retry).map_err(|(field, reason)| (field.to_string(), reason))?;
    if let Some(attempts) = retry.max_attempts
        && !(0..=101).contains(&attempts)
    {
        return Err(("max_attempts".into(), format!("must be between 1 and 101, got {attempts}")));
    }
    for (i, rule) in retry.rules.iter().flatten().enumerate() {
        validate_rule(rule).map_err(|(field, reason)| (format!("rules[{i}].{field}"), reason))?;
    }
    if let Some(circuit) = &retry.circuit {
        let field = |f: &str| format!("circuit.{f}");
        if !(circuit.failure_rate > 0.0 && circuit.failure_rate <= 1.0) {
            return Err((
                field("failure_rate"),
                format!("must be above 0 and at most 1, got {}", circuit.failure_rate),
            ));
        }
        if !(circuit.window_secs.is_finite() && circuit.window_secs > 0.0) {
            return Err((
                field("window_secs"),
                format!("must be a positive number of seconds, got {}", circuit.window_secs),
            ));
        }
        if !(circuit.open_secs.is_finite() && circuit.open_secs > 0.0) {
            return Err((
                field("open_secs"),
                format!("must be a positive number of seconds, got {}", circuit.open_secs),
            ));
        }
        if circuit.min_executions < 1 {
            return Err((field("min_executions"), format!("must be at least 1, got {}", circuit.min_executions)));
        }
    }
    Ok(())
}

fn validate_rule(rule: &RetryRule) -> Result<(), (String, String)> {
    let when = &rule.when;
    let err = |field: &str, reason: String| Err((field.to_string(), reason));
    if when.exit_codes.is_none() && when.failure_kinds.is_none() && when.http_status.is_none() && when.result.is_none()
    {
        return err("when", "needs at least one of exit_codes, failure_kinds, http_status, result".into());
    }
    if let Some(code) = when.exit_codes.iter().flatten().find(|c| !(1..=255).contains(*c)) {
        return err("when.exit_codes", format!("{code} is not a failing exit code (1-255)"));
    }
    if let Some(kind) = when.failure_kinds.iter().flatten().find(|k| k.is_never_retried()) {
        return err("when.failure_kinds", format!("'{kind}' executions are never retried automatically"));
    }
    if let Some(status) = when.http_status.iter().flatten().find(|s| !(100..=599).contains(*s)) {
        return err("when.http_status", format!("{status} is not an HTTP status (100-599)"));
    }
    if let Some(result) = &when.result {
        if let Some(segment) =
            result.segments().into_iter().find(|s| s.is_empty() || s.parse::<i64>().is_ok_and(|n| n < 0))
        {
            return err(
                "when.result.path",
                format!(
                    "'{}': segment '{segment}' is not a key or an index (keys and indices >= 0, joined by '.')",
                    result.path
                ),
            );
        }
        match (&result.equals, &result.one_of) {
            (Some(_), None) | (None, Some(_)) => {}
            _ => {
                return err(
                    "when.result",
                    "needs exactly one of 'equals' (a value) and 'in' (a list of values)".into(),
                );
            }
        }
    }
    let then = &rule.then;
    if then.action == RuleDo::Fail {
        let extra = [
            ("attempts", then.attempts.is_some()),
            ("backoff", then.backoff.is_some()),
            ("delay_secs", then.delay_secs.is_some()),
            ("max_delay_secs", then.max_delay_secs.is_some()),
            ("multiplier", then.multiplier.is_some()),
            ("jitter", then.jitter.is_some()),
        ];
        if let Some((name, _)) = extra.iter().find(|(_, set)| *set) {
            return err(&format!("then.{name}"), "means nothing with 'do: fail'".into());
        }
        return Ok(());
    }
    if let Some(attempts) = then.attempts
        && !(1..=1000).contains(&attempts)
    {
        return err(
            "then.attempts",
            format!("must be between 1 and 1000 (total attempts, the first included), got {attempts}"),
        );
    }
    let as_policy = RetryPolicy {
        backoff: then.backoff,
        base_delay_secs: then.delay_secs,
        max_delay_secs: then.max_delay_secs,
        multiplier: then.multiplier,
        jitter: then.jitter,
        ..Default::default()
    };
    validate_retry_fields(&as_policy).map_err(|(field, reason)| {
        let field = match field {
            "base_delay_secs" => "delay_secs",
            other => other,
        };
        (format!("then.{field}"), reason.replace("base_delay_secs", "delay_secs"))
    })
}

fn validate_retry_fields(retry: &RetryPolicy) -> Result<(), (&'static str, String)> {
    let positive = |value: Option<f64>, field: &'static str| match value {
        Some(v) if !(v.is_finite() && v > 0.0) => {
            Err((field, format!("must be a positive number of seconds, got {v}")))
        }
        _ => Ok(()),
    };
    positive(retry.base_delay_secs, "base_delay_secs")?;
    positive(retry.max_delay_secs, "max_delay_secs")?;
    if let (Some(base), Some(max)) = (retry.base_delay_secs, retry.max_delay_secs)
        && base > max
    {
        return Err(("max_delay_secs", format!("must not be below base_delay_secs ({base})")));
    }
    if let Some(multiplier) = retry.multiplier
        && !(multiplier.is_finite() && multiplier >= 1.0)
    {
        return Err(("multiplier", format!("must be at least 1.0, got {multiplier}")));
    }
    if let Some(jitter) = retry.jitter
        && !(0.0..=1.0).contains(&jitter)
    {
        return Err(("jitter", format!("must be between 0.0 and 1.0, got {jitter}")));
    }
    if let Some(kinds) = &retry.on
        && let Some(kind) = kinds.iter().find(|k| k.is_never_retried())
    {
        return Err(("on", format!("'{kind}' executions are never retried automatically")));
    }
    if let Some(codes) = &retry.exit_codes
        && let Some(code) = codes.iter().find(|c| !(1..=255).contains(*c))
    {
        return Err(("exit_codes", format!("{code} is not a failing exit code (1-255)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED_ACTION: &str = "name: flaky_api_call\nruntime: python\nentrypoint: actions/flaky_api.py\ntimeout_seconds: 120 # Custom timeout (overrides global 5 min)\nmax_retries: 3 # Retry up to 3 times on failure\nparameters:\n  url:\n    type: string\n    required: true\n";

    fn parse(yaml: &str) -> Result<ActionSpec, PackError> {
        let file = Path::new("mypack/actions/flaky-api.yaml");
        parse_action(Path::new("mypack"), file, yaml, |path| path == Path::new("mypack/actions/flaky_api.py"))
    }

    #[test]
    fn an_http_url_may_take_its_port_path_and_query_from_parameters_but_not_its_host() {
        let params = "parameters:\n  port:\n    type: integer\n  page:\n    type: string\n";
        for url in [
            "http://127.0.0.1:{{ port }}/{{ page }}",
            "https://user@api.example.com/{{ page }}?q={{ page }}",
            "http://[::1]:{{ port }}/x",
            "http://example.com\\\\{{ page }}",
        ] {
            let yaml = format!("name: x\nruntime: http\n{params}http:\n  url: \"{url}\"\n");
            assert!(parse(&yaml).is_ok(), "{url}: {:?}", parse(&yaml).err());
        }
    }

    #[test]
    fn a_flattened_copy_of_the_quick_start_yaml_is_refused_showing_the_indented_form() {
        let flat = "name: flaky_api_call\nruntime: python\nentrypoint: actions/flaky_api.py\ntimeout_seconds: 120\nmax_retries: 3\nparameters:\nurl:\ntype: string\nrequired: true\n";
        let error = parse_action(Path::new("p"), Path::new("actions/flaky-api.yaml"), flat, |_| true).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("parameters"), "{error}");
        let said = error.to_string();
        assert!(said.contains("not indented") && said.contains("parameters:\n  url:\n    type: string"), "{said}");
        // the indented form loads
        let indented = "name: flaky_api_call\nruntime: python\nentrypoint: actions/flaky_api.py\nparameters:\n  url:\n    type: string\n    required: true\n";
        assert!(parse_action(Path::new("p"), Path::new("actions/flaky-api.yaml"), indented, |_| true).is_ok());
    }

    #[test]
    fn credential_headers_are_known_and_a_literal_one_is_warned_of() {
        for name in [
            "Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "X-Auth-Token",
            "Ocp-Apim-Subscription-Key",
            "X-Functions-Key",
        ] {
            assert!(is_sensitive_header(name), "{name}");
        }
        for name in ["Content-Type", "Accept", "User-Agent", "Idempotency-Key", "traceparent"] {
            assert!(!is_sensitive_header(name), "{name}");
        }
        let spec = parse(
            "name: x\nruntime: http\nparameters:\n  t: {type: string, secret: true}\nhttp:\n  url: \"http://h/\"\n  headers:\n    X-Api-Key: abc\n    Authorization: \"Bearer {{ t }}\"\n    Accept: text/plain\n",
        )
        .unwrap();
        let warnings = spec.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("'http.headers.X-Api-Key'"), "{warnings:?}");
    }

    #[test]
    fn a_retention_block_gives_ages_per_finished_status() {
        let spec = parse(
            "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretention:\n  completed: 1d\n  failed: 'off'\n",
        )
        .unwrap();
        use crate::ExecutionStatus::{Completed, Failed};
        use crate::retention::Age;
        assert_eq!(spec.retention_ages().unwrap(), vec![(Completed, Age::days(1)), (Failed, Age::OFF)]);
        assert_eq!(parse(SEED_ACTION).unwrap().retention_ages().unwrap(), vec![]);
    }

    #[test]
    fn the_seed_action_parses_as_written() {
        let spec = parse(SEED_ACTION).unwrap();
        assert_eq!(spec.timeout_seconds, Some(120));
        assert_eq!(spec.max_retries, Some(3));
        assert!(spec.parameters["url"].required);
    }

    #[test]
    fn errors_name_file_field_and_reason() {
        let cases = [
            ("name: x\nentrypoint: actions/flaky_api.py\n", "runtime", "missing field"),
            ("name: x\nruntime: ruby\nentrypoint: actions/flaky_api.py\n", "runtime", "unknown runtime 'ruby'"),
            ("name: x\nruntime: python\nentrypoint: actions/missing.py\n", "entrypoint", "not found"),
            ("name: x\nruntime: python\nentrypoint: ../etc/passwd\n", "entrypoint", "inside the pack"),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\ntimeout_seconds: 0\n",
                "timeout_seconds",
                "at least 1",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nmax_retries: -2\n",
                "max_retries",
                "between 0 and 100",
            ),
            ("name: x\nruntime: python\nentrypoint: actions/flaky_api.py\ntimeout: 5\n", "timeout", "unknown field"),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nconcurrency: {limit: 0}\n",
                "concurrency.limit",
                "between 1 and 100000",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nconcurrency: {limit: 1, key: host}\n",
                "concurrency.key",
                "'host' is not a parameter",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nparameters:\n  host:\n    type: string\n    secret: true\nconcurrency: {limit: 1, key: host}\n",
                "concurrency.key",
                "secret parameter",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nconcurrency: {limit: 1, per: host}\n",
                "per",
                "unknown field `per`, expected `limit` or `key`",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nparameters:\n  n:\n    type: integer\n    default: abc\n",
                "parameters.n.default",
                "expected integer",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  jitter: 2\n",
                "retry.jitter",
                "between 0.0 and 1.0",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  base_delay_secs: 10\n  max_delay_secs: 5\n",
                "retry.max_delay_secs",
                "below base",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  exit_codes: [0]\n",
                "retry.exit_codes",
                "not a failing exit code",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nparameters:\n  url:\n    type: string\n    default: \"a\\0b\"\n",
                "parameters.url.default",
                "NUL",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  rules:\n    - when: {}\n      then: {do: retry}\n",
                "retry.rules[0].when",
                "at least one of",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  rules:\n    - when: {exit_codes: [3]}\n      then: {do: retry}\n    - when: {http_status: [700]}\n      then: {do: fail}\n",
                "retry.rules[1].when.http_status",
                "not an HTTP status",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  rules:\n    - when: {failure_kinds: [canceled]}\n      then: {do: retry}\n",
                "retry.rules[0].when.failure_kinds",
                "never retried",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  rules:\n    - when: {http_status: [401]}\n      then: {do: fail, attempts: 3}\n",
                "retry.rules[0].then.attempts",
                "means nothing with 'do: fail'",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  rules:\n    - when: {http_status: [503]}\n      then: {do: retry, delay_secs: -1}\n",
                "retry.rules[0].then.delay_secs",
                "positive",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  rules:\n    - when: {result: {path: a..b, equals: 1}}\n      then: {do: fail}\n",
                "retry.rules[0].when.result.path",
                "not a key or an index",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  rules:\n    - when: {result: {path: a}}\n      then: {do: fail}\n",
                "retry.rules[0].when.result",
                "exactly one of",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  circuit: {failure_rate: 1.5, window_secs: 60, min_executions: 5, open_secs: 30}\n",
                "retry.circuit.failure_rate",
                "at most 1",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  id:\n    type: string\nhttp:\n  url: \"http://h/{{ other }}\"\n",
                "http.url",
                "'{{ other }}' names no declared parameter",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\nhttp:\n  url: \"https://{{ host }}/x\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://@{{ host }}:{{ port }}/x\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://{{ user }}@example.com/x\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://example.com{{ rest }}\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://[{{ host }}]:80/x\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://[::1{{ rest }}]/x\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://%7B%7B{{ host }}/x\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://u:{{ rest }}@example.com/x\"\n",
                "http.url",
                "host must be written",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http:///{{ rest }}\"\n",
                "http.url",
                "must name its host",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  host:\n    type: string\n  port:\n    type: string\n  user:\n    type: string\n  rest:\n    type: string\nhttp:\n  url: \"http://user@/x\"\n",
                "http.url",
                "must name its host",
            ),
            ("name: x\nruntime: http\nhttp:\n  url: \"ftp://h/\"\n", "http.url", "http:// or https://"),
            ("name: x\nruntime: http\nhttp:\n  method: FETCH\n  url: \"http://h/\"\n", "http.method", "unknown method"),
            ("name: x\nruntime: http\n", "http", "needs an 'http' block"),
            (
                "name: x\nruntime: http\nentrypoint: actions/flaky_api.py\nhttp:\n  url: \"http://h/\"\n",
                "entrypoint",
                "no entrypoint",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nhttp:\n  url: \"http://h/\"\n",
                "http",
                "only an http action",
            ),
            ("name: x\nruntime: python\n", "entrypoint", "missing field"),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nlimits:\n  memory_mb: 8\n",
                "limits.memory_mb",
                "between 16 and 1048576, got 8",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nlimits: {memory_mb: 64, cpu_secs: -1}\n",
                "limits.cpu_secs",
                "between 1 and",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nlimits: {open_files: 3}\n",
                "limits.open_files",
                "between 16 and",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nlimits: {output_kb: 0}\n",
                "limits.output_kb",
                "between 1 and",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretention: {running: 1d}\n",
                "retention",
                "'running' is not a finished status",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretention: {failed: 3w}\n",
                "retention.failed",
                "unknown unit 'w'",
            ),
            (
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nlimits: {memory: 64}\n",
                "memory",
                "unknown field `memory`, expected one of `memory_mb`",
            ),
            (
                "name: x\nruntime: http\nhttp:\n  url: \"http://h/\"\nlimits: {memory_mb: 64}\n",
                "limits",
                "inside the worker",
            ),
            (
                "name: x\nruntime: http\nparameters:\n  t:\n    type: string\nhttp:\n  url: \"http://h/\"\n  body: {\"{{ t }}\": \"{{ u }}\"}\n",
                "http.body",
                "'{{ u }}' names no declared parameter",
            ),
        ];
        for (yaml, field, reason) in cases {
            let err = parse(yaml).unwrap_err();
            assert!(err.file.ends_with("actions/flaky-api.yaml"), "{yaml}: {err}");
            assert_eq!(err.field.as_deref(), Some(field), "{yaml}: {err}");
            assert!(err.reason.contains(reason), "{yaml}: {err}");
            let shown = err.to_string();
            assert!(shown.contains("flaky-api.yaml") && shown.contains(field), "{shown}");
        }
    }

    #[test]
    fn a_bad_type_in_yaml_names_the_file() {
        let err = parse("name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nmax_retries: lots\n").unwrap_err();
        assert!(err.to_string().contains("flaky-api.yaml"), "{err}");
        assert!(err.to_string().contains("max_retries"), "{err}");
    }

    #[test]
    fn a_nul_in_the_manifest_is_named() {
        let err = parse_manifest(Path::new("p/pack.yaml"), "ref: p\nversion: \"1\\0\"\n").unwrap_err();
        assert_eq!(err.field.as_deref(), Some("version"), "{err}");
    }

    #[test]
    fn a_manifest_ref_must_be_an_identifier() {
        let err = parse_manifest(Path::new("p/pack.yaml"), "ref: My Pack\nversion: 1\n").unwrap_err();
        assert_eq!(err.field.as_deref(), Some("ref"), "{err}");
    }

    #[test]
    fn the_retry_forms_of_every_seed_parse() {
        let spec = parse(
            "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nmax_retries: -1\nretry:\n  rules:\n    - when: {http_status: [429, 500, 502, 503, 504]}\n      then: {do: retry, attempts: 10, backoff: exponential, delay_secs: 2}\n    - when: {exit_codes: [3], failure_kinds: [timeout]}\n      then: {do: retry, attempts: 2, backoff: fixed, delay_secs: 5}\n    - when: {http_status: [401, 403]}\n      then: {do: fail}\n  circuit: {failure_rate: 0.5, window_secs: 60, min_executions: 5, open_secs: 30}\n",
        )
        .unwrap();
        assert_eq!(spec.max_retries_in_force(), -1);
        let retry = spec.retry.as_ref().unwrap();
        let rules = retry.rules.as_ref().unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[1].when.failure_kinds, Some(vec![FailureKind::Timeout]));
        assert_eq!((rules[2].then.action, rules[0].then.attempts), (RuleDo::Fail, Some(10)));
        assert_eq!(retry.circuit.as_ref().unwrap().min_executions, 5);
        // stored as JSON and read back by the executor unchanged
        let stored = serde_json::to_value(retry).unwrap();
        assert_eq!(&serde_json::from_value::<RetryPolicy>(stored).unwrap(), retry);

        let tasker = |retry: &str| {
            parse(&format!("name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n{retry}")).unwrap()
        };
        assert_eq!(tasker("  max_attempts: 3\n").max_retries_in_force(), 2);
        assert_eq!(tasker("  max_attempts: 1\n").max_retries_in_force(), 0);
        assert_eq!(tasker("  max_attempts: 0\n").max_retries_in_force(), 0);
        assert_eq!(tasker("  retryable: false\n  max_attempts: 3\n").max_retries_in_force(), 0);
        assert!(tasker("  max_attempts: 0\n").warnings()[0].contains("configuration error"));
        assert!(tasker("  max_attempts: 3\n").warnings().is_empty());
    }

    #[test]
    fn limits_parse_and_take_the_workers_defaults_within_its_maximums() {
        let spec = parse(
            "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nlimits:\n  memory_mb: 128\n  cpu_secs: 1\n  open_files: 16\n  output_kb: 4\n",
        )
        .unwrap();
        let asked = spec.limits.unwrap();
        assert_eq!(
            asked,
            ActionLimits { memory_mb: Some(128), cpu_secs: Some(1), open_files: Some(16), output_kb: Some(4) }
        );
        // stored as JSON and read back by the worker unchanged
        assert_eq!(serde_json::from_value::<ActionLimits>(serde_json::to_value(asked).unwrap()).unwrap(), asked);
        let worker = LimitSettings {
            memory_mb: 1024,
            max_memory_mb: 4096,
            cpu_secs: None,
            max_cpu_secs: None,
            open_files: 1024,
            max_open_files: 65536,
            output_bytes: 65536,
            max_output_bytes: 1 << 20,
        };
        // (asked, worker settings, in force)
        let cases = [
            (None, worker, Limits { memory_mb: 1024, cpu_secs: None, open_files: 1024, output_bytes: 65536 }),
            (Some(asked), worker, Limits { memory_mb: 128, cpu_secs: Some(1), open_files: 16, output_bytes: 4096 }),
            (
                Some(ActionLimits { memory_mb: Some(8192), output_kb: Some(4096), ..Default::default() }),
                worker,
                Limits { memory_mb: 4096, cpu_secs: None, open_files: 1024, output_bytes: 1 << 20 },
            ),
            (
                Some(ActionLimits { cpu_secs: Some(600), ..Default::default() }),
                LimitSettings { cpu_secs: Some(60), max_cpu_secs: Some(300), ..worker },
                Limits { memory_mb: 1024, cpu_secs: Some(300), open_files: 1024, output_bytes: 65536 },
            ),
            (
                None,
                LimitSettings { cpu_secs: None, max_cpu_secs: Some(300), ..worker },
                Limits { memory_mb: 1024, cpu_secs: Some(300), open_files: 1024, output_bytes: 65536 },
            ),
            (
                None,
                LimitSettings { cpu_secs: Some(60), max_cpu_secs: None, max_open_files: 256, ..worker },
                Limits { memory_mb: 1024, cpu_secs: Some(60), open_files: 256, output_bytes: 65536 },
            ),
        ];
        for (asked, settings, expected) in cases {
            assert_eq!(settings.in_force(asked.as_ref()), expected, "{asked:?} on {settings:?}");
        }
    }

    #[test]
    fn an_http_action_parses_with_templates_naming_its_parameters() {
        let spec = parse(
            "name: x\nruntime: http\nparameters:\n  id:\n    type: string\n  token:\n    type: string\nhttp:\n  method: POST\n  url: \"http://127.0.0.1:8080/items/{{ id }}?q={{id}}\"\n  headers:\n    Authorization: \"Bearer {{ token }}\"\n  body: {id: \"{{ id }}\", n: 3}\n",
        )
        .unwrap();
        let http = spec.http.unwrap();
        assert_eq!((http.method.as_str(), http.headers.len()), ("POST", 1));
        assert_eq!(spec.entrypoint, "");
    }

    #[test]
    fn a_parse_error_names_the_field_but_never_echoes_the_file() {
        let secret = "s3cr3t-value";
        let cases = [
            format!("name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nmax_retries: {secret}\n"),
            format!("name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nretry:\n  backoff: {secret}\n"),
            format!("name: x\nruntime: python\nentrypoint: actions/flaky_api.py\ntimeout_seconds: [\"{secret}\"]\n"),
            format!("name: [{secret}]\nruntime: python\nentrypoint: actions/flaky_api.py\n"),
        ];
        for yaml in &cases {
            let err = parse(yaml).unwrap_err();
            let shown = err.to_string();
            assert!(!shown.contains(secret), "{shown}");
            assert!(
                shown.contains("flaky-api.yaml") && (shown.contains("expected") || shown.contains("invalid")),
                "{shown}"
            );
        }
        assert_eq!(
            without_content("max_retries: invalid type: string \"abc\", expected i32 at line 4 column 14"),
            "max_retries: invalid type: string, expected i32 at line 4 column 14"
        );
        assert_eq!(
            without_content("retry.backoff: unknown variant `zig`, expected one of `fixed`, `linear`"),
            "retry.backoff: unknown variant, expected one of `fixed`, `linear`"
        );
    }
}
