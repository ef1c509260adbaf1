//! `attune workflow get | tree`: a workflow run and its steps (`routes::workflows::WorkflowRun`),
//! each step's executions (`db::workflow::StepExecution`) under it.

use anyhow::Context;
use attune_api::routes::workflows::{Step, WorkflowRun};
use attune_cli::client::{Answer, Client};
use attune_cli::output::{shown, table};
use attune_cli::tail::escaped;
use attune_core::workflow::Phase;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::print;
use crate::Output;

/// `attune workflow get ID`: the run, then one row per step.
pub async fn get(client: &Client, out: Output, id: i64) -> anyhow::Result<i32> {
    let run: Answer<WorkflowRun> = client.get(&format!("/api/v1/workflows/{id}"), &[]).await?;
    print(out, &run, |run| steps(run));
    Ok(0)
}

/// `attune workflow tree ID [--step NAME] [--all]`: each step, and under it each execution it
/// made (the first page of each step's, or with `--all` every page).
pub async fn tree(client: &Client, out: Output, id: i64, step: Option<String>, all: bool) -> anyhow::Result<i32> {
    let path = format!("/api/v1/workflows/{id}");
    let query: Vec<(&str, String)> = step.iter().map(|step| ("step", step.clone())).collect();
    // (the pages are joined in the JSON, which `--output json` prints as the API sent it)
    let mut run: Value = client.get(&path, &query).await?;
    if all {
        for step in run["steps"].as_array_mut().into_iter().flatten() {
            while let Some(after) = step["next_after"].as_i64() {
                let name = step["name"].as_str().unwrap_or_default().to_string();
                let query = [("step", name), ("after", after.to_string()), ("limit", "10000".into())];
                let page: Value = client.get(&path, &query).await?;
                let more = &page["steps"][0];
                let executions = more["executions"].as_array().cloned().unwrap_or_default();
                if let Some(listed) = step["executions"].as_array_mut() {
                    listed.extend(executions);
                }
                step["next_after"] = more["next_after"].clone();
            }
        }
    }
    let run: Answer<WorkflowRun> =
        Answer::read(run).with_context(|| format!("reading the API's answer to GET {path}"))?;
    print(out, &run, |run| executions(run));
    Ok(0)
}

/// Seconds between two times, as `1.234s`; `-` when one is missing.
fn between(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> String {
    match (from, to) {
        (Some(from), Some(to)) => format!("{:.3}s", (to - from).num_milliseconds() as f64 / 1000.0),
        _ => "-".into(),
    }
}

/// A step's items as `done/total` (with what is in flight and failed), or `-`.
fn items(step: &Step) -> String {
    match &step.items {
        None => "-".into(),
        Some(items) => {
            format!("{}/{} ({} running, {} failed)", items.succeeded, items.total, items.in_flight, items.failed)
        }
    }
}

/// `attune workflow get`: the run, then one row per step.
fn steps(run: &WorkflowRun) -> String {
    let head = &run.run;
    let mut out = format!(
        "workflow run {}  {}  {}  (definition {})\n",
        head.id,
        head.action_ref,
        head.status.as_str().to_uppercase(),
        run.definition.chars().take(12).collect::<String>()
    );
    if let Some(error) = &head.error {
        out.push_str(&format!("error: {}\n", escaped(error)));
    }
    let rows: Vec<Vec<String>> = run
        .steps
        .iter()
        .map(|step| {
            vec![
                step.name.clone(),
                shown(&step.phase),
                step.action.clone(),
                step.state.as_str().to_string(),
                step.attempts.to_string(),
                items(step),
                between(step.started, step.finished),
                step.reason.as_deref().map(|r| escaped(r).into_owned()).unwrap_or_default(),
            ]
        })
        .collect();
    out.push_str(&table(&["step", "phase", "action", "state", "executions", "items", "took", "reason"], &rows));
    out
}

/// `attune workflow tree`: each step, and under it each execution it made.
fn executions(run: &WorkflowRun) -> String {
    let head = &run.run;
    let mut lines = vec![format!("{} {} [{}]", head.action_ref, head.id, head.status.as_str())];
    for (n, step) in run.steps.iter().enumerate() {
        let last = n + 1 == run.steps.len();
        let (branch, indent) = if last { ("└─", "   ") } else { ("├─", "│  ") };
        let on_failure = if step.phase == Phase::OnFailure { " (on-failure)" } else { "" };
        lines.push(format!(
            "{branch} {}{on_failure}: {} [{}]{}",
            step.name,
            step.action,
            step.state.as_str(),
            step.reason.as_deref().map(|r| format!(" {}", escaped(r))).unwrap_or_default()
        ));
        let hidden = step.attempts.saturating_sub(step.executions.len());
        for (m, execution) in step.executions.iter().enumerate() {
            let twig = if m + 1 == step.executions.len() && hidden == 0 { "└─" } else { "├─" };
            let item = if step.items.is_none() { String::new() } else { format!("item {} ", execution.item) };
            let attempt = match execution.retry_count {
                0 => String::new(),
                n => format!(" retry {n}"),
            };
            let error = execution.error.as_deref().map(|e| format!(": {}", escaped(e))).unwrap_or_default();
            lines.push(format!(
                "{indent}{twig} {item}execution {} [{}]{attempt} {}{error}",
                execution.id,
                execution.status.as_str(),
                between(execution.started, execution.finished)
            ));
        }
        if hidden > 0 {
            lines.push(format!("{indent}└─ … and {hidden} more executions (--all shows them)"));
        }
    }
    lines.join("\n")
}
