//! Workflows: `workflows/NAME.yaml` in a pack, several actions run as one durable run.
//!
//! ```yaml
//! name: remediate
//! input:
//!   hosts: {type: array, required: true}
//! steps:
//!   - name: check
//!     action: ops.check
//!     parameters: {hosts: "{{ input.hosts }}"}
//!   - name: restart
//!     action: ops.restart
//!     when: "{{ steps.check.result.unhealthy }} != []"
//!     with-items: "{{ steps.check.result.unhealthy }}"
//!     concurrency: 50
//!     parameters: {host: "{{ item }}"}
//!     retry: {max_attempts: 3}
//!   - name: verify
//!     action: ops.check
//!     parameters: {hosts: "{{ input.hosts }}"}
//! on-failure:
//!   - name: page
//!     action: core.echo
//!     parameters: {message: "remediation failed at {{ failure.step }}: {{ failure.error }}"}
//! result: "{{ steps.verify.result }}"
//! ```
//!
//! Steps run in the order written, each after the one before it, unless it names what it
//! `needs` (earlier steps; `needs: []` starts with the run). A step's `when` false skips it (a
//! skipped step counts as done for those that need it). `with-items` runs the step once per
//! item of a list, at most `concurrency` at once, and the step is done when every item is (its
//! result is the list of the items' results, in order). A step that fails (after its own
//! retries) stops the run from starting more steps; once nothing is in flight the `on-failure`
//! steps run, and the run fails. The run's `result` is rendered when every step is done.
//!
//! This module parses and validates a definition (`parse`) and decides, from the record of
//! what its steps did, what to start and when the run ends (`plan`). It holds no state: every
//! decision is a function of the definition, the input and the steps' executions, so a
//! decision taken again after a crash is the same decision.

pub mod expr;
mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path as FilePath;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::pack::{PackError, RetryPolicy, is_identifier, parse_yaml};
use crate::params::ParamSpecs;
pub use expr::{Condition, Path};
pub use plan::{Attempt, Finish, ItemState, Phase, Plan, Start, StepState, StepView, plan};

/// The runtime of a workflow's action row: no worker runs it, the executors advance it.
pub const RUNTIME: &str = "workflow";
/// The most items one `with-items` step may have.
pub const MOST_ITEMS: usize = 10_000;
/// The most items of one step in flight at once.
pub const MOST_CONCURRENT_ITEMS: u32 = 1_000;
/// Items in flight at once when a step does not say.
pub const DEFAULT_CONCURRENCY: u32 = 10;
/// How long a run may take when its definition does not say: a day.
pub const DEFAULT_TIMEOUT_SECS: i32 = 86_400;
/// The most steps a definition may have (main and on-failure together).
pub const MOST_STEPS: usize = 200;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The run's parameters, declared as an action's are.
    #[serde(default)]
    pub input: ParamSpecs,
    pub steps: Vec<StepSpec>,
    #[serde(default, rename = "on-failure", alias = "on_failure", skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<StepSpec>,
    /// The run's result, a template; by default each step's result by its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The whole run's limit (default a day); each step keeps its action's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    pub name: String,
    /// The action this step runs (`pack.action`).
    pub action: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// The steps this one starts after; by default the one written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Vec<String>>,
    #[serde(default, rename = "with-items", alias = "with_items", skip_serializing_if = "Option::is_none")]
    pub with_items: Option<Value>,
    /// Items in flight at once (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Over the action's own: retries after the first attempt (-1 unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<i32>,
    /// Over the action's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// Over the action's own `retry:` block, in any of its forms (Tasker's `max_attempts` and
    /// `retryable`, rules by exit code, kind or result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Argyll's form of a step's retries: folded into `max_retries` and `retry` when the file is
    /// loaded (`WorkConfig::fold`), so what is stored and run is one form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_config: Option<WorkConfig>,
}

/// Argyll's `work_config`: `max_retries` (-1 unlimited, 0 the global default), `init_backoff`
/// and `max_backoff` in milliseconds (0: the global default), `backoff_type` (`fixed`, `linear`,
/// `exponential`; empty: the global default).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkConfig {
    #[serde(default)]
    pub max_retries: i32,
    #[serde(default)]
    pub init_backoff: u64,
    #[serde(default)]
    pub max_backoff: u64,
    #[serde(default)]
    pub backoff_type: String,
}

impl WorkConfig {
    /// The step's `max_retries` and `retry` block this stands for.
    fn fold(&self) -> Result<(Option<i32>, RetryPolicy), (&'static str, String)> {
        use crate::pack::BackoffKind;
        let backoff = match self.backoff_type.as_str() {
            "" => None,
            "fixed" => Some(BackoffKind::Fixed),
            "linear" => Some(BackoffKind::Linear),
            "exponential" => Some(BackoffKind::Exponential),
            other => {
                return Err((
                    "backoff_type",
                    format!("unknown backoff type '{other}' (expected fixed, linear or exponential)"),
                ));
            }
        };
        if !(-1..=100).contains(&self.max_retries) {
            return Err(("max_retries", "must be between 0 and 100, or -1 for unlimited".into()));
        }
        let secs = |ms: u64| (ms > 0).then_some(ms as f64 / 1000.0);
        let retry = RetryPolicy {
            backoff,
            base_delay_secs: secs(self.init_backoff),
            max_delay_secs: secs(self.max_backoff),
            ..RetryPolicy::default()
        };
        Ok(((self.max_retries != 0).then_some(self.max_retries), retry))
    }
}

impl StepSpec {
    /// The retries this step's executions get over the action's, if the step says.
    pub fn max_retries_in_force(&self) -> Option<i32> {
        let retry = self.retry.as_ref();
        if retry.and_then(|r| r.retryable) == Some(false) {
            return Some(0);
        }
        self.max_retries.or_else(|| retry.and_then(|r| r.max_attempts).map(|a| (a - 1).max(0)))
    }

    pub fn concurrency(&self) -> u32 {
        self.concurrency.unwrap_or(DEFAULT_CONCURRENCY)
    }

    /// The steps it waits for; `previous` is the one written before it.
    pub fn needs<'a>(&'a self, previous: Option<&'a str>) -> Vec<&'a str> {
        match &self.needs {
            Some(needs) => needs.iter().map(String::as_str).collect(),
            None => previous.into_iter().collect(),
        }
    }
}

impl WorkflowSpec {
    /// Every step, main then on-failure, with its phase.
    pub fn all_steps(&self) -> impl Iterator<Item = (Phase, &StepSpec)> {
        self.steps.iter().map(|s| (Phase::Main, s)).chain(self.on_failure.iter().map(|s| (Phase::OnFailure, s)))
    }

    /// The names of its main steps (not the on-failure ones).
    pub fn main_steps(&self) -> Vec<&str> {
        self.steps.iter().map(|s| s.name.as_str()).collect()
    }

    pub fn step(&self, name: &str) -> Option<&StepSpec> {
        self.all_steps().map(|(_, s)| s).find(|s| s.name == name)
    }

    /// The actions its steps run, each once.
    pub fn actions(&self) -> BTreeSet<&str> {
        self.all_steps().map(|(_, s)| s.action.as_str()).collect()
    }

    pub fn timeout_seconds(&self) -> i32 {
        self.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECS)
    }
}

/// Parses and validates `workflows/NAME.yaml` of pack `pack_ref`; an error names the file and the
/// field (`steps.restart.with-items`). Whether each step's action exists is the registration's
/// check (it may be in another pack).
pub fn parse(file: &FilePath, text: &str) -> Result<WorkflowSpec, PackError> {
    let mut spec: WorkflowSpec = parse_yaml(file, text)?;
    fold_work_configs(&mut spec).map_err(|(field, reason)| PackError::new(file, Some(&field), reason))?;
    validate(&spec).map_err(|(field, reason)| PackError::new(file, Some(&field), reason))?;
    Ok(spec)
}

/// Each step's Argyll `work_config`, as the `max_retries` and `retry` it stands for.
fn fold_work_configs(spec: &mut WorkflowSpec) -> Result<(), (String, String)> {
    for (prefix, list) in [("steps", &mut spec.steps), ("on-failure", &mut spec.on_failure)] {
        for step in list.iter_mut() {
            let Some(work) = step.work_config.take() else { continue };
            let field = |name: &str| format!("{prefix}.{}.{name}", step.name);
            if step.retry.is_some() || step.max_retries.is_some() {
                return Err((field("work_config"), "give 'work_config' or 'retry'/'max_retries', not both".into()));
            }
            let (max_retries, retry) =
                work.fold().map_err(|(name, reason)| (field(&format!("work_config.{name}")), reason))?;
            step.max_retries = max_retries;
            step.retry = Some(retry);
        }
    }
    Ok(())
}

fn validate(spec: &WorkflowSpec) -> Result<(), (String, String)> {
    if !is_identifier(&spec.name) {
        return Err(("name".into(), "must be lowercase letters, digits, '_' or '-'".into()));
    }
    if spec.steps.is_empty() {
        return Err(("steps".into(), "a workflow needs at least one step".into()));
    }
    if spec.steps.len() + spec.on_failure.len() > MOST_STEPS {
        return Err(("steps".into(), format!("at most {MOST_STEPS} steps (main and on-failure together)")));
    }
    if let Some(timeout) = spec.timeout_seconds
        && timeout < 1
    {
        return Err(("timeout_seconds".into(), "must be at least 1".into()));
    }
    for (name, param) in &spec.input {
        crate::params::check_spec(name, param).map_err(|e| (format!("input.{name}.default"), e.reason))?;
    }
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    // main steps: those a step may refer to are those it (transitively) needs
    let mut before: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let main: BTreeSet<&str> = spec.steps.iter().map(|s| s.name.as_str()).collect();
    for (phase, list) in [(Phase::Main, &spec.steps), (Phase::OnFailure, &spec.on_failure)] {
        let prefix = if phase == Phase::Main { "steps" } else { "on-failure" };
        let mut previous: Option<&str> = None;
        for step in list {
            let at = format!("{prefix}.{}", if is_identifier(&step.name) { step.name.as_str() } else { "name" });
            let field = |name: &str| format!("{at}.{name}");
            if !is_identifier(&step.name) {
                return Err((at, "a step's name must be lowercase letters, digits, '_' or '-'".into()));
            }
            if !seen.insert(&step.name) {
                return Err((field("name"), format!("a second step named '{}'", step.name)));
            }
            if !step.action.contains('.') || step.action.split('.').any(|part| !is_identifier(part)) {
                return Err((field("action"), format!("'{}' is not an action reference (pack.action)", step.action)));
            }
            let mut known: BTreeSet<&str> = BTreeSet::new();
            let phase_names: BTreeSet<&str> = list.iter().map(|s| s.name.as_str()).collect();
            for need in step.needs(previous) {
                if !before.contains_key(need) || !phase_names.contains(need) {
                    return Err((
                        field("needs"),
                        format!("'{need}' is not a step written before this one in the same list"),
                    ));
                }
                known.insert(need);
                known.extend(before[need].iter().copied());
            }
            if phase == Phase::OnFailure {
                // the main steps may have run or not: each is referred to as it ended
                known.extend(main.iter().copied());
            }
            let check = |paths: Vec<&Path>, name: &str| -> Result<(), (String, String)> {
                for path in paths {
                    check_path(spec, step, phase, &known, path).map_err(|reason| (field(name), reason))?;
                }
                Ok(())
            };
            if let Some(when) = &step.when {
                let condition = Condition::parse(when).map_err(|e| (field("when"), e))?;
                if condition.paths().iter().any(|p| matches!(p.root(), "item" | "index")) {
                    return Err((
                        field("when"),
                        "'when' decides the whole step, before its items: it cannot refer to 'item' or 'index'".into(),
                    ));
                }
                check(condition.paths(), "when")?;
            }
            if let Some(items) = &step.with_items {
                let paths = expr::paths(items).map_err(|e| (field("with-items"), e))?;
                if paths.iter().any(|p| matches!(p.root(), "item" | "index")) {
                    return Err((field("with-items"), "the list cannot refer to its own item".into()));
                }
                check(paths.iter().collect(), "with-items")?;
            } else if step.concurrency.is_some() {
                return Err((field("concurrency"), "only a step with 'with-items' has a concurrency".into()));
            }
            if let Some(concurrency) = step.concurrency
                && !(1..=MOST_CONCURRENT_ITEMS).contains(&concurrency)
            {
                return Err((field("concurrency"), format!("must be between 1 and {MOST_CONCURRENT_ITEMS}")));
            }
            for (name, value) in &step.parameters {
                let paths = expr::paths(value).map_err(|e| (field(&format!("parameters.{name}")), e))?;
                check(paths.iter().collect(), &format!("parameters.{name}"))?;
            }
            if let Some(timeout) = step.timeout_seconds
                && timeout < 1
            {
                return Err((field("timeout_seconds"), "must be at least 1".into()));
            }
            if let Some(max_retries) = step.max_retries
                && !(-1..=100).contains(&max_retries)
            {
                return Err((field("max_retries"), "must be between 0 and 100, or -1 for unlimited".into()));
            }
            if step.max_retries.is_some() && step.retry.as_ref().is_some_and(|r| r.max_attempts.is_some()) {
                return Err((
                    field("max_retries"),
                    "both 'max_retries' and 'retry.max_attempts' are given; give one".into(),
                ));
            }
            if let Some(retry) = &step.retry {
                crate::pack::validate_retry(retry)
                    .map_err(|(name, reason)| (field(&format!("retry.{name}")), reason))?;
            }
            before.insert(&step.name, known);
            previous = Some(&step.name);
        }
    }
    if let Some(result) = &spec.result {
        let paths = expr::paths(result).map_err(|e| ("result".to_string(), e))?;
        for path in &paths {
            match path.root() {
                "input" => check_input(spec, path),
                "steps" if path.name().is_some_and(|n| main.contains(n)) => Ok(()),
                "steps" => Err(format!("'{}' names no step", path.text())),
                other => Err(format!("'{other}' is not available in the result (input and steps are)")),
            }
            .map_err(|reason| ("result".to_string(), reason))?;
        }
    }
    Ok(())
}

fn check_input(spec: &WorkflowSpec, path: &Path) -> Result<(), String> {
    match path.name() {
        Some(name) if spec.input.contains_key(name) => Ok(()),
        Some(name) => Err(format!("'{}': '{name}' is not a declared input", path.text())),
        None => Ok(()),
    }
}

/// What a reference in `step` may name: a declared input, a step it comes after, its own item.
fn check_path(
    spec: &WorkflowSpec,
    step: &StepSpec,
    phase: Phase,
    known: &BTreeSet<&str>,
    path: &Path,
) -> Result<(), String> {
    match path.root() {
        "input" => check_input(spec, path),
        "steps" => match path.name() {
            Some(name) if known.contains(name) => Ok(()),
            Some(name) if spec.step(name).is_some() => Err(format!(
                "'{}': step '{name}' is not sure to have ended before this one (name it in 'needs', or write it before)",
                path.text()
            )),
            Some(name) => Err(format!("'{}': there is no step '{name}'", path.text())),
            None => Err("'steps' alone is not a value: name a step (steps.NAME.result)".into()),
        },
        "item" | "index" if step.with_items.is_some() => Ok(()),
        "item" | "index" => Err(format!("'{}' is only known in a step with 'with-items'", path.text())),
        "failure" if phase == Phase::OnFailure => Ok(()),
        "failure" => Err(format!("'{}' is only known in an on-failure step", path.text())),
        other => Err(format!("unknown root '{other}'")),
    }
}

/// The definition's canonical JSON, which its pin (a hash) is taken over.
pub fn canonical(spec: &WorkflowSpec) -> Value {
    serde_json::to_value(spec).expect("a workflow serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    const REMEDIATE: &str = r#"
name: remediate
input:
  hosts: {type: array, required: true}
steps:
  - name: check
    action: ops.check
    parameters: {hosts: "{{ input.hosts }}"}
  - name: restart
    action: ops.restart
    when: "{{ steps.check.result.unhealthy }} != []"
    with-items: "{{ steps.check.result.unhealthy }}"
    concurrency: 50
    parameters: {host: "{{ item }}", n: "{{ index }}"}
    retry: {max_attempts: 3}
  - name: verify
    action: ops.check
    parameters: {hosts: "{{ input.hosts }}"}
on-failure:
  - name: page
    action: core.echo
    parameters: {message: "failed at {{ failure.step }}: {{ failure.error }} ({{ steps.check.status }})"}
result: "{{ steps.verify.result }}"
"#;

    fn error_of(text: &str) -> PackError {
        parse(FilePath::new("packs/ops/workflows/w.yaml"), text).unwrap_err()
    }

    #[test]
    fn the_example_parses() {
        let spec = parse(FilePath::new("w.yaml"), REMEDIATE).unwrap();
        assert_eq!(spec.steps.len(), 3);
        assert_eq!(spec.steps[1].concurrency(), 50);
        assert_eq!(spec.steps[1].max_retries_in_force(), Some(2));
        assert_eq!(spec.steps[0].max_retries_in_force(), None);
        assert_eq!(spec.actions().into_iter().collect::<Vec<_>>(), ["core.echo", "ops.check", "ops.restart"]);
    }

    #[test]
    fn each_mistake_names_its_field() {
        let cases: [(&str, &str, &str); 11] = [
            ("name: w\nsteps: []\n", "steps", "at least one step"),
            ("name: w\nsteps:\n  - {name: a, action: nodot}\n", "steps.a.action", "not an action reference"),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x}\n  - {name: a, action: p.y}\n",
                "steps.a.name",
                "a second step",
            ),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x, parameters: {h: '{{ steps.b.result }}'}}\n  - {name: b, action: p.y}\n",
                "steps.a.parameters.h",
                "not sure to have ended",
            ),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x, parameters: {h: '{{ input.nope }}'}}\n",
                "steps.a.parameters.h",
                "not a declared input",
            ),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x, parameters: {h: '{{ item }}'}}\n",
                "steps.a.parameters.h",
                "only known in a step with 'with-items'",
            ),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x, when: '{{ input.x }} =='}\n",
                "steps.a.when",
                "ends where a value",
            ),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x, needs: [z]}\n",
                "steps.a.needs",
                "'z' is not a step written before",
            ),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x, with-items: [1], concurrency: 0}\n",
                "steps.a.concurrency",
                "between 1 and",
            ),
            ("name: w\nsteps:\n  - {name: a, action: p.x, frobnicate: 1}\n", "frobnicate", "unknown field"),
            (
                "name: w\nsteps:\n  - {name: a, action: p.x, with-items: [1], when: '{{ item }}'}\n",
                "steps.a.when",
                "cannot refer to 'item'",
            ),
        ];
        for (text, field, reason) in cases {
            let error = error_of(text);
            assert_eq!(error.field.as_deref(), Some(field), "{text}: {error}");
            assert!(error.reason.contains(reason), "{text}: {error}");
            assert!(error.to_string().starts_with("packs/ops/workflows/w.yaml: "), "{error}");
        }
        let error = error_of("name: w\nsteps:\n  - {name: a, action: p.x}\nresult: '{{ failure.step }}'\n");
        assert_eq!(error.field.as_deref(), Some("result"), "{error}");
    }

    #[test]
    fn argyll_s_work_config_is_a_step_s_retries() {
        let text = "name: w\nsteps:\n  - name: charge\n    action: p.x\n    work_config: {max_retries: 3, init_backoff: 1000, max_backoff: 30000, backoff_type: exponential}\n";
        let spec = parse(FilePath::new("w.yaml"), text).unwrap();
        let step = &spec.steps[0];
        assert_eq!(step.max_retries, Some(3));
        let retry = step.retry.as_ref().unwrap();
        assert_eq!((retry.base_delay_secs, retry.max_delay_secs), (Some(1.0), Some(30.0)));
        assert_eq!(retry.backoff, Some(crate::pack::BackoffKind::Exponential));
        assert_eq!(step.work_config, None, "stored in one form");
        // 0 and empty: the global defaults
        let spec =
            parse(FilePath::new("w.yaml"), "name: w\nsteps:\n  - {name: a, action: p.x, work_config: {}}\n").unwrap();
        assert_eq!((spec.steps[0].max_retries, spec.steps[0].retry.clone()), (None, Some(RetryPolicy::default())));
        let error = error_of("name: w\nsteps:\n  - {name: a, action: p.x, work_config: {backoff_type: random}}\n");
        assert_eq!(error.field.as_deref(), Some("steps.a.work_config.backoff_type"), "{error}");
        let error = error_of("name: w\nsteps:\n  - {name: a, action: p.x, max_retries: 1, work_config: {}}\n");
        assert_eq!(error.field.as_deref(), Some("steps.a.work_config"), "{error}");
    }

    #[test]
    fn needs_let_independent_steps_refer_only_to_what_they_follow() {
        let text = "name: w\nsteps:\n  - {name: a, action: p.x}\n  - {name: b, action: p.x, needs: []}\n  - {name: c, action: p.x, needs: [a, b], parameters: {x: '{{ steps.a.result }}', y: '{{ steps.b.result }}'}}\n";
        parse(FilePath::new("w.yaml"), text).unwrap();
        let text = "name: w\nsteps:\n  - {name: a, action: p.x}\n  - {name: b, action: p.x, needs: [], parameters: {x: '{{ steps.a.result }}'}}\n";
        assert!(error_of(text).reason.contains("not sure to have ended"));
    }
}
