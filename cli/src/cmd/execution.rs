//! `attune execution get | retry | cancel | fail | explain | list | bulk`: one execution as
//! `GET /executions/{id}` shows it (`routes::executions::ExecutionView`), the changes made to one
//! by hand (answered as the `db::execution::Execution` they made), a page of them
//! (`Page<ExecutionSummary>`) and a bulk action (`routes::executions::bulk::BulkOutcome`).

use anyhow::bail;
use attune_api::routes::executions::bulk::BulkOutcome;
use attune_api::routes::executions::{ExecutionView, Page};
use attune_cli::client::{Answer, Client};
use attune_cli::output::{self, present, shown};
use attune_common::db::execution::{Execution, api::ExecutionSummary};
use serde_json::{Map, json};

use super::run::finish;
use super::{action, print};
use crate::{BulkArgs, Output};

/// The execution `id`, as `GET /executions/{id}` shows it.
pub async fn view(client: &Client, id: i64) -> anyhow::Result<Answer<ExecutionView>> {
    client.get(&format!("/api/v1/executions/{id}"), &[]).await
}

/// `attune execution get ID`
pub async fn get(client: &Client, out: Output, id: i64) -> anyhow::Result<i32> {
    print(out, &view(client, id).await?, |e| told(e));
    Ok(0)
}

/// `attune execution retry ID [key=value ...] [--wait]`: a manual retry, changing only the
/// parameters named (the API keeps the rest, sealed secrets as they were).
pub async fn retry(
    client: &Client,
    out: Output,
    id: i64,
    params: &[String],
    wait: bool,
    wait_timeout: u64,
) -> anyhow::Result<i32> {
    let body = if params.is_empty() {
        json!({})
    } else {
        let original = view(client, id).await?;
        let action = action::get_action(client, &original.execution.action_ref).await?;
        json!({"parameters": action::parse_params(&action.parameters, params)?, "merge": true})
    };
    let retry: Answer<Execution> = client.post(&format!("/api/v1/executions/{id}/retry"), &body).await?;
    finish(client, out, retry, wait, wait_timeout).await
}

/// `attune execution cancel ID`
pub async fn cancel(client: &Client, out: Output, id: i64) -> anyhow::Result<i32> {
    let canceled: Answer<Execution> = client.post(&format!("/api/v1/executions/{id}/cancel"), &json!({})).await?;
    print(out, &canceled, |e| format!("execution {} {}", e.id, e.status.as_str()));
    Ok(0)
}

/// `attune execution fail ID --reason TEXT`
pub async fn fail(client: &Client, out: Output, id: i64, reason: &str) -> anyhow::Result<i32> {
    let failed: Answer<Execution> =
        client.post(&format!("/api/v1/executions/{id}/fail"), &json!({"reason": reason})).await?;
    print(out, &failed, |e| format!("execution {} {} ({})", e.id, e.status.as_str(), shown(&e.error)));
    Ok(0)
}

/// `attune execution explain ID`: why it was or was not retried.
pub async fn explain(client: &Client, out: Output, id: i64) -> anyhow::Result<i32> {
    // (told from the JSON: the decision is a JSON record in the API's type too)
    print(out, &view(client, id).await?, |v| output::explain(v.json()));
    Ok(0)
}

/// `attune execution list [--status S] [--action REF] [--limit N] [--offset N]`
pub async fn list(
    client: &Client,
    out: Output,
    status: Option<String>,
    action: Option<String>,
    limit: i64,
    offset: i64,
) -> anyhow::Result<i32> {
    let mut query = vec![("limit", limit.to_string()), ("offset", offset.to_string())];
    query.extend(status.map(|status| ("status", status)));
    query.extend(action.map(|action| ("action_ref", action)));
    let page: Answer<Page<ExecutionSummary>> = client.get("/api/v1/executions", &query).await?;
    print(out, &page, |page| {
        let rows: Vec<Vec<String>> = page
            .items
            .iter()
            .map(|e| {
                vec![
                    e.id.to_string(),
                    e.action_ref.clone(),
                    // a failure retried already is handled: where its chain went on
                    match e.retried_by {
                        Some(retry) => format!("{} → {retry}", e.status.as_str()),
                        None => e.status.as_str().to_string(),
                    },
                    shown(&e.worker),
                    e.retry_count.to_string(),
                    shown(&e.failure_kind),
                    shown(&e.created),
                ]
            })
            .collect();
        format!(
            "{}\n({} of {}{})",
            output::table(&["id", "action", "status", "worker", "retry", "failure", "created"], &rows),
            rows.len(),
            page.total,
            if page.total_exact { "" } else { "+" }
        )
    });
    Ok(0)
}

/// `attune execution bulk retry | cancel | fail [filters] --reason TEXT [--dry-run]`
pub async fn bulk(client: &Client, out: Output, args: BulkArgs, reason: Option<String>) -> anyhow::Result<i32> {
    let BulkArgs {
        action,
        status,
        action_ref,
        failure_kind,
        created_after,
        created_before,
        chain_root,
        limit,
        dry_run,
    } = args;
    // (only the conditions given)
    let given = [
        ("status", json!(status)),
        ("action_ref", json!(action_ref)),
        ("failure_kind", json!(failure_kind)),
        ("created_after", json!(created_after)),
        ("created_before", json!(created_before)),
        ("chain_root", json!(chain_root)),
    ];
    let filter: Map<_, _> =
        given.into_iter().filter(|(_, v)| !v.is_null()).map(|(name, v)| (name.to_string(), v)).collect();
    let Some(reason) = reason else { bail!("a bulk action needs --reason: say why") };
    let body = json!({"action": action, "filter": filter, "dry_run": dry_run, "limit": limit, "reason": reason});
    let outcome: Answer<BulkOutcome> = client.post("/api/v1/executions/bulk", &body).await?;
    print(out, &outcome, |o| {
        let listed = |ids: Vec<String>, between: &str| if ids.is_empty() { "-".into() } else { ids.join(between) };
        let selected: Vec<String> = o.selected.iter().map(i64::to_string).collect();
        let mut lines = vec![
            format!(
                "{} {} selected{}: {}",
                if o.dry_run { "dry run:" } else { "" },
                selected.len(),
                if o.more { " (more match: run again for the rest)" } else { "" },
                listed(selected, " ")
            )
            .trim_start()
            .to_string(),
        ];
        if !o.dry_run {
            let done = o.done.iter().map(|d| d.execution_id.to_string()).collect();
            lines.push(format!("done: {}", listed(done, " ")));
            let skipped = o.skipped.iter().map(|s| format!("{} ({})", s.id, s.code)).collect();
            lines.push(format!("skipped: {}", listed(skipped, ", ")));
        }
        lines.join("\n")
    });
    Ok(0)
}

/// An execution as `execution get` and `run --wait` tell it: its head, why it waits, its fields
/// that are set, its parameters and result, its output.
pub fn told(view: &ExecutionView) -> String {
    let e = &view.execution;
    let mut lines = vec![format!("execution {}  {}  {}", e.id, e.action_ref, e.status.as_str().to_uppercase())];
    if let Some(why) = waiting(view) {
        lines.push(format!("  {:<18} {why}", "waiting"));
    }
    let fields = [
        ("worker", present(&e.worker)),
        ("exit_code", present(&e.exit_code)),
        ("failure_kind", present(&e.failure_kind)),
        ("error", present(&e.error)),
        ("retry_count", present(&e.retry_count)),
        ("max_retries", present(&e.max_retries)),
        ("retry_reason", present(&e.retry_reason)),
        ("original_execution", present(&e.original_execution)),
        ("retried_by", present(&view.retried_by)),
        ("next_attempt_at", present(&view.next_attempt_at)),
        ("created", present(&e.created)),
        ("updated", present(&e.updated)),
    ];
    for (field, value) in fields {
        if let Some(value) = value {
            lines.push(format!("  {field:<18} {value}"));
        }
    }
    lines.push(format!("  {:<18} {}", "parameters", e.parameters));
    if let Some(result) = &e.result {
        lines.push(format!("  {:<18} {result}", "result"));
    }
    for (stream, text) in [("stdout", &e.stdout), ("stderr", &e.stderr)] {
        if let Some(text) = text.as_deref().filter(|s| !s.is_empty()) {
            lines.push(format!("  {stream}:"));
            lines.extend(text.lines().map(|l| format!("    {l}")));
        }
    }
    lines.join("\n")
}

/// Why the execution waits, in words, while it does: its `waiting.message`, and who paused what
/// holds it.
pub fn waiting(view: &ExecutionView) -> Option<String> {
    let waiting = view.waiting.as_ref()?;
    let message = waiting["message"].as_str()?;
    Some(match waiting["paused_by_name"].as_str() {
        Some(by) => format!("{message} (paused by {by})"),
        None => message.to_string(),
    })
}
