//! The pack format: `pack.yaml` plus `actions/*.yaml`, parsed from text and validated. Reading
//! the files is the caller's (`attune_common::pack::load_pack`); this module only decides.
//!
//! An invalid file names the file, the field and the reason, e.g.
//! `packs/core/actions/echo.yaml: field 'timeout_seconds': must be at least 1`.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::failure::FailureKind;
use crate::params::{self, ParamSpecs};

/// Runtimes a worker may offer. `builtin` actions run inside the worker without a process
/// (`core.noop`, for measuring the platform itself).
pub const RUNTIMES: [&str; 3] = ["shell", "python", "builtin"];
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
    pub entrypoint: String,
    /// Overrides the global default (300 s) when set.
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
    /// Retries after the first attempt.
    #[serde(default)]
    pub max_retries: Option<i32>,
    #[serde(default)]
    pub parameters: ParamSpecs,
    #[serde(default)]
    pub retry: Option<RetryPolicy>,
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoadedAction {
    pub action_ref: String,
    pub spec: ActionSpec,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoadedPack {
    pub manifest: PackManifest,
    pub path: PathBuf,
    pub actions: Vec<LoadedAction>,
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
        let message = e.to_string();
        // serde names the field in "missing field `x`" / "unknown field `x`"; lift it out so the
        // error has the same shape as the semantic checks below.
        let field = message.split('`').nth(1).filter(|_| message.contains(" field `"));
        PackError::new(file, field, message.clone())
    })
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
    let spec: ActionSpec = parse_yaml(file, text)?;
    refuse_nul(file, &spec)?;
    validate_action(pack_dir, file, &spec, entrypoint_exists)?;
    Ok(spec)
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
    if spec.runtime == "builtin" {
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
            return fail("entrypoint", format!("file '{}' not found in the pack", spec.entrypoint));
        }
    }
    if let Some(timeout) = spec.timeout_seconds
        && timeout < 1
    {
        return fail("timeout_seconds", "must be at least 1".into());
    }
    if let Some(max_retries) = spec.max_retries
        && !(0..=100).contains(&max_retries)
    {
        return fail("max_retries", "must be between 0 and 100".into());
    }
    for (name, param) in &spec.parameters {
        if let Err(e) = params::check_spec(name, param) {
            return fail(&format!("parameters.{name}.default"), e.reason);
        }
    }
    if let Some(retry) = &spec.retry {
        validate_retry(retry).or_else(|(field, reason)| fail(&format!("retry.{field}"), reason))?;
    }
    Ok(())
}

fn validate_retry(retry: &RetryPolicy) -> Result<(), (&'static str, String)> {
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
                "name: x\nruntime: python\nentrypoint: actions/flaky_api.py\nmax_retries: -1\n",
                "max_retries",
                "between 0 and 100",
            ),
            ("name: x\nruntime: python\nentrypoint: actions/flaky_api.py\ntimeout: 5\n", "timeout", "unknown field"),
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
}
