//! `attune execution watch | chain`: the retry chain an execution belongs to
//! (`routes::executions::chain::Chain`), whole (`Attempt`) or light (`AttemptSummary`).

use std::time::{Duration, Instant};

use anyhow::bail;
use attune_api::routes::executions::chain::{Attempt, AttemptSummary, Chain};
use attune_cli::client::{Answer, Client};
use attune_cli::output::{self, shown};
use attune_core::ExecutionStatus;
use serde::de::DeserializeOwned;

use super::execution::view;
use super::print_json;
use crate::Output;

/// `attune execution watch ID`: one line per attempt state change (or, with `--output json`,
/// the final chain), until its last attempt ends with no retry to come. Exit 0 if it completed.
pub async fn watch(client: &Client, out: Output, id: i64, timeout: Duration) -> anyhow::Result<i32> {
    let started = Instant::now();
    let mut seen: Vec<(i64, ExecutionStatus)> = Vec::new();
    loop {
        let chain = whole_chain::<AttemptSummary>(client, id, "summary").await?;
        for attempt in &chain.attempts {
            let state = (attempt.id, attempt.status);
            if !seen.contains(&state) && out == Output::Table {
                let mut line =
                    format!("attempt {} (execution {}): {}", attempt.retry_count, attempt.id, attempt.status.as_str());
                if attempt.status == ExecutionStatus::Delayed {
                    line.push_str(&format!(", next attempt at {}", shown(&attempt.not_before)));
                }
                if let Some(kind) = attempt.failure_kind {
                    line.push_str(&format!(" ({})", shown(&kind)));
                }
                attune_cli::say!("{line}");
            }
            if !seen.contains(&state) {
                seen.push(state);
            }
        }
        let Some(last) = chain.attempts.last() else { bail!("execution {id} has no chain") };
        if last.status.is_terminal() && view(client, last.id).await?.retried_by.is_none() {
            if out == Output::Json {
                print_json(&whole_chain::<Attempt>(client, id, "full").await?);
            }
            return Ok(if last.status == ExecutionStatus::Completed { 0 } else { 2 });
        }
        if started.elapsed() > timeout {
            bail!("the chain of execution {id} had not ended after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `attune execution chain ID`: every attempt, a row each (whole, as JSON).
pub async fn chain(client: &Client, out: Output, id: i64) -> anyhow::Result<i32> {
    if out == Output::Json {
        print_json(&whole_chain::<Attempt>(client, id, "full").await?);
        return Ok(0);
    }
    // the table shows only light fields
    let chain = whole_chain::<AttemptSummary>(client, id, "summary").await?;
    let secs = |s: Option<f64>| s.map(|s| format!("{s:.3}s")).unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = chain
        .attempts
        .iter()
        .map(|a| {
            vec![
                a.retry_count.to_string(),
                a.id.to_string(),
                a.status.as_str().to_string(),
                shown(&a.retry_reason),
                shown(&a.failure_kind),
                shown(&a.worker),
                secs(a.backoff_secs),
                secs(a.gap_secs),
                if a.status == ExecutionStatus::Delayed { shown(&a.not_before) } else { shown(&a.finished) },
            ]
        })
        .collect();
    attune_cli::say!(
        "{}",
        output::table(
            &["attempt", "id", "status", "reason", "failure", "worker", "backoff", "gap", "finished / next at"],
            &rows,
        )
    );
    Ok(0)
}

/// The retry chain of `id`, every attempt of it (`fields`: `summary` or `full`, read as `T`): an
/// answer of the chain API holds what its byte budget allows and says where the rest start
/// (`next_offset`), so the pages are read until the last and returned as one answer.
async fn whole_chain<T: DeserializeOwned>(client: &Client, id: i64, fields: &str) -> anyhow::Result<Chain<Answer<T>>> {
    let path = format!("/api/v1/executions/{id}/chain");
    let mut chain: Chain<Answer<T>> = client.get(&path, &[("fields", fields.to_string())]).await?;
    while let Some(next) = chain.next_offset {
        let page: Chain<Answer<T>> =
            client.get(&path, &[("fields", fields.to_string()), ("offset", next.to_string())]).await?;
        if page.attempts.is_empty() {
            break;
        }
        chain.attempts.extend(page.attempts);
        chain.next_offset = page.next_offset;
    }
    chain.next_offset = None;
    chain.truncated = false;
    Ok(chain)
}
