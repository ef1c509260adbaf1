//! The `workflow` workload (issue 48): 40 sequential steps of `core.echo` and of
//! `core.python_echo` (each run's time by the record: its `created` to its `finished`), each run
//! paired with the spawn floor's 40 runs of the same script measured right before it (`floorbench
//! spawn ... concurrency=1`, when it is built: the ratio of each pair, and their median), and the
//! graph of a run with many finished steps (`GET /workflows/{id}` as a client first asks it, the
//! first page of each step's executions: p95 of its answer times). The workflows are the `bench`
//! pack's (`packs/bench`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::workloads::{Bench, Measured};

/// Steps in each of the sequential workflows.
const STEPS: f64 = 40.0;

pub(crate) async fn run(bench: &Bench, quick: bool, fan_items: usize) -> anyhow::Result<Vec<Measured>> {
    let runs = if quick { 2 } else { 7 };
    let mut out = Vec::new();
    let floor = floorbench();
    for (name, workflow, script) in [
        // (the echo target is absolute, 10 ms a step; the python one is against the floor)
        ("workflow: 40 × core.echo in sequence", "bench.seq40_echo", None),
        (
            "workflow: 40 × core.python_echo in sequence",
            "bench.seq40_python",
            Some(("packs/core/actions/python_echo.py", "python3")),
        ),
    ] {
        let started = Instant::now();
        let mut latencies = Vec::new();
        let mut ratios = Vec::new();
        let mut not_completed = 0;
        for _ in 0..runs {
            // the floor's 40 runs of the same script, measured right before this run (the
            // machine's speed drifts by tens of percent within minutes: only a pair compares)
            let floor_ms = match (&floor, script) {
                (Some(floor), Some(script)) => Some(STEPS * spawn_floor_ms(floor, script).await?),
                _ => None,
            };
            let (id, _) = bench.submit(workflow, &json!({})).await?;
            let run = finished(bench, id, Duration::from_secs(300)).await?;
            not_completed += usize::from(run["status"] != "completed");
            let took = span_ms(&run["created"], &run["finished"])?;
            latencies.push(took);
            if let Some(floor_ms) = floor_ms {
                ratios.push(took / floor_ms);
            }
        }
        let median = median_of(&latencies);
        let mut extra =
            json!({"steps": STEPS, "runs": runs, "median_run_ms": round(median), "per_step_ms": round(median / STEPS)});
        if !ratios.is_empty() {
            let ratio = median_of(&ratios);
            extra["ratio_to_spawn_floor"] = json!(round(ratio));
            extra["ratios_to_spawn_floor"] = json!(ratios.iter().map(|r| round(*r)).collect::<Vec<_>>());
            eprintln!(
                "  {name}: {ratio:.2} × the spawn floor's 40 runs (median of {} pairs, each run against the floor measured right before it)",
                ratios.len()
            );
        }
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

fn median_of(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    sorted[sorted.len() / 2]
}

/// The spawn floor's binary (`floorbench spawn`, `../shared/floorbench`, or
/// `ATTUNE_FLOORBENCH_DIR`), if it is built; `ATTUNE_BENCH_NO_FLOOR` leaves it out.
fn floorbench() -> Option<std::path::PathBuf> {
    if std::env::var_os("ATTUNE_BENCH_NO_FLOOR").is_some() {
        return None;
    }
    let dir: std::path::PathBuf =
        std::env::var_os("ATTUNE_FLOORBENCH_DIR").map_or_else(|| "../shared/floorbench".into(), Into::into);
    Some(dir.join("target/release/floorbench")).filter(|path| path.is_file())
}

/// One run of `script` by the spawn floor, in milliseconds: the mean of what it spawns one at a
/// time in a second (after a second of warming up).
async fn spawn_floor_ms(floor: &std::path::Path, (script, interpreter): (&str, &str)) -> anyhow::Result<f64> {
    let output = tokio::process::Command::new(floor)
        .args(["spawn", &format!("script={script}"), &format!("interpreter={interpreter}")])
        .args(["concurrency=1", "secs=1", "warm=1"])
        .output()
        .await
        .with_context(|| format!("running {}", floor.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find(|line| line.starts_with("latency spawn"))
        .and_then(|line| line.split_whitespace().find_map(|word| word.strip_prefix("mean=")))
        .and_then(|mean| mean.strip_suffix("ms"))
        .and_then(|mean| mean.parse().ok())
        .with_context(|| format!("no `latency spawn ... mean=` line from {}: {text}", floor.display()))
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
