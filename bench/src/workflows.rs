//! The `workflow` workload (issue 48): 40 sequential steps of `core.echo` and of
//! `core.python_echo` (each run's time by the record: its `created` to its `finished`), and the
//! graph of a run with many finished steps (`GET /workflows/{id}` as a client first asks it, the first page of each step's executions: p95 of its answer times). The
//! workflows are the `bench` pack's (`packs/bench`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::workloads::{Bench, Measured};

/// Steps in each of the sequential workflows.
const STEPS: f64 = 40.0;

pub(crate) async fn run(bench: &Bench, quick: bool, fan_items: usize) -> anyhow::Result<Vec<Measured>> {
    let runs = if quick { 2 } else { 7 };
    let mut out = Vec::new();
    for (name, workflow) in [
        ("workflow: 40 × core.echo in sequence", "bench.seq40_echo"),
        ("workflow: 40 × core.python_echo in sequence", "bench.seq40_python"),
    ] {
        let started = Instant::now();
        let mut latencies = Vec::new();
        let mut not_completed = 0;
        for _ in 0..runs {
            let (id, _) = bench.submit(workflow, &json!({})).await?;
            let run = finished(bench, id, Duration::from_secs(300)).await?;
            not_completed += usize::from(run["status"] != "completed");
            latencies.push(span_ms(&run["created"], &run["finished"])?);
        }
        let mut sorted = latencies.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let median = sorted[sorted.len() / 2];
        let extra =
            json!({"steps": STEPS, "runs": runs, "median_run_ms": round(median), "per_step_ms": round(median / STEPS)});
        out.push(Measured::new(name, runs, started.elapsed().as_secs_f64(), latencies, not_completed, extra));
    }
    let items = if quick { 500 } else { fan_items };
    let started = Instant::now();
    let (id, _) = bench.submit("bench.fan", &json!({"count": items})).await?;
    let run = finished(bench, id, Duration::from_secs(1800)).await?;
    let mut latencies = Vec::new();
    for _ in 0..if quick { 10 } else { 40 } {
        let asked = Instant::now();
        let response =
            bench.http.get(format!("{}/api/v1/workflows/{id}", bench.api)).bearer_auth(&bench.token).send().await?;
        let status = response.status();
        let body: Value = response.json().await?;
        if !status.is_success() {
            bail!("GET /workflows/{id}: {status} {body}");
        }
        latencies.push(asked.elapsed().as_secs_f64() * 1000.0);
        let each = &body["steps"][1];
        let (attempts, done) =
            (each["attempts"].as_u64().unwrap_or(0), each["items"]["succeeded"].as_u64().unwrap_or(0));
        if attempts < items as u64 || done != items as u64 || each["executions"].as_array().is_none_or(Vec::is_empty) {
            bail!("the graph of run {id} counts {attempts} executions and {done} items done, not {items}: {each}");
        }
    }
    let extra = json!({
        "items": items,
        "run_ms": round(span_ms(&run["created"], &run["finished"])?),
        "status": run["status"],
    });
    let name = format!("workflow: graph of a run with {items} finished steps");
    out.push(Measured::new(&name, latencies.len(), started.elapsed().as_secs_f64(), latencies, 0, extra));
    Ok(out)
}

fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn span_ms(from: &Value, to: &Value) -> anyhow::Result<f64> {
    let at = |v: &Value| {
        v.as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok()).context("a run without its times")
    };
    Ok((at(to)? - at(from)?).num_microseconds().unwrap_or(0) as f64 / 1000.0)
}

/// Execution `id` once it has finished (read every 20 ms).
async fn finished(bench: &Bench, id: i64, patience: Duration) -> anyhow::Result<Value> {
    let deadline = Instant::now() + patience;
    loop {
        let response =
            bench.http.get(format!("{}/api/v1/executions/{id}", bench.api)).bearer_auth(&bench.token).send().await?;
        let run: Value = response.json().await?;
        if matches!(run["status"].as_str(), Some("completed" | "failed" | "timeout" | "canceled" | "abandoned")) {
            return Ok(run);
        }
        if Instant::now() > deadline {
            bail!("workflow run {id} did not finish within {patience:?}: {}", run["status"]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
