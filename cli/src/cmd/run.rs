//! `attune run`: submits an execution (`db::execution::Execution` is the answer) and, with
//! `--wait`, follows it and its automatic retries until the last attempt ends; exit 0 only if it
//! completed. `execution retry` and `schedule run` end the same way (`finish`).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::bail;
use attune_api::routes::executions::ExecutionView;
use attune_cli::client::{Answer, Client};
use attune_cli::output::{present, shown};
use attune_common::db::execution::Execution;
use attune_core::ExecutionStatus;
use serde_json::json;

use super::execution::{told, view, waiting};
use super::{action, print};
use crate::Output;

/// How often `attune run` sends its submission, and the waits between.
const SUBMISSION_RETRIES: [Duration; 3] = [Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];

/// `attune run REF [key=value ...] [--wait] [--idempotency-key KEY]`
pub async fn run(
    client: &Client,
    out: Output,
    action_ref: &str,
    params: &[String],
    wait: bool,
    wait_timeout: u64,
    idempotency_key: Option<String>,
) -> anyhow::Result<i32> {
    let action = action::get_action(client, action_ref).await?;
    let parameters = action::parse_params(&action.parameters, params)?;
    let body = json!({"action_ref": action_ref, "parameters": parameters});
    let execution = submit(client, &body, idempotency_key).await?;
    finish(client, out, execution, wait, wait_timeout).await
}

/// Submits `body` with an idempotency key (the one given, else one made for this command): a
/// submission whose answer never came (the connection broke, the API restarted, a 503) may have
/// been written, and is sent again with the same key, which gives the written execution back
/// rather than make a second one. Once it gives up, the error names the key to run again with.
async fn submit(client: &Client, body: &serde_json::Value, key: Option<String>) -> anyhow::Result<Answer<Execution>> {
    let key = key.unwrap_or_else(|| format!("cli-{:032x}", rand::random::<u128>()));
    let headers = [("Idempotency-Key", key.clone())];
    let mut waits = SUBMISSION_RETRIES.iter();
    loop {
        let sent =
            client.request_with_headers(reqwest::Method::POST, "/api/v1/executions", &[], &headers, Some(body)).await;
        match sent {
            Err(e) if attune_cli::client::unanswered(&e) => match waits.next() {
                Some(wait) => {
                    eprintln!("attune: no answer to the submission ({e:#}); sending it again with the same key");
                    tokio::time::sleep(*wait).await;
                }
                None => {
                    return Err(e.context(format!(
                        "the submission may have been written: run the command again with --idempotency-key {key} \
                         to get it back rather than make another"
                    )));
                }
            },
            other => return other,
        }
    }
}

/// Prints a submitted execution, or waits for it and prints how it ended (exit 0 only if it
/// completed).
pub async fn finish(
    client: &Client,
    out: Output,
    execution: Answer<Execution>,
    wait: bool,
    wait_timeout: u64,
) -> anyhow::Result<i32> {
    if !wait {
        print(out, &execution, |e| format!("execution {} {}", e.id, e.status.as_str()));
        return Ok(0);
    }
    let finished = wait_for(client, execution.id, Duration::from_secs(wait_timeout)).await?;
    print(out, &finished, |e| told(e));
    Ok(if finished.execution.status == ExecutionStatus::Completed { 0 } else { 2 })
}

/// Waits for execution `id` to end, following its automatic retries: returns the last attempt
/// of its chain once it has ended with no retry to come.
async fn wait_for(client: &Client, id: i64, timeout: Duration) -> anyhow::Result<Answer<ExecutionView>> {
    const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    let interactive = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut frame = 0;
    let mut current = id;
    let mut told_hold: Option<String> = None;
    loop {
        let view = view(client, current).await?;
        let execution = &view.execution;
        let status = execution.status.as_str();
        // (a script's log hears once what holds it, each time that changes; the short waits of
        // a line and a claim are not worth a line)
        let holding =
            view.waiting.as_ref().and_then(|w| w["reason"].as_str()).filter(|r| !matches!(*r, "queued" | "scheduling"));
        if !interactive && holding.map(str::to_string) != told_hold {
            if let (Some(_), Some(why)) = (holding, waiting(&view)) {
                eprintln!("execution {current} waits: {why}");
            }
            told_hold = holding.map(str::to_string);
        }
        let terminal = execution.status.is_terminal();
        if terminal && let Some(retry) = view.retried_by {
            if !interactive {
                eprintln!(
                    "execution {current} {status} ({}); retrying as execution {retry}",
                    shown(&execution.failure_kind)
                );
            }
            current = retry;
            continue;
        }
        if terminal {
            if interactive {
                eprint!("\r\x1b[2K");
            }
            return Ok(view);
        }
        if started.elapsed() > timeout {
            match waiting(&view) {
                Some(why) => bail!("execution {current} is still {status} after {}s: {why}", timeout.as_secs()),
                None => bail!("execution {current} is still {status} after {}s", timeout.as_secs()),
            }
        }
        if interactive {
            let attempt = execution.retry_count;
            let detail = match (execution.status, present(&execution.not_before), waiting(&view)) {
                (ExecutionStatus::Delayed, Some(at), _) => format!("retry {attempt} waits until {at}"),
                (_, _, Some(why)) if attempt > 0 => format!("retry {attempt} {status}: {why}"),
                (_, _, Some(why)) => format!("{status}: {why}"),
                _ if attempt > 0 => format!("retry {attempt} {status}"),
                _ => status.to_string(),
            };
            eprint!(
                "\r\x1b[2K{} execution {current} {detail} ({:.1}s)",
                FRAMES[frame % FRAMES.len()],
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
            frame += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
