//! `attune worker list | drain | undrain` and `attune config`: the workers as the scheduler sees
//! them, and the executors' settings in force (`routes::workers::EffectiveConfig`).

use attune_api::routes::workers::EffectiveConfig;
use attune_cli::client::{Answer, Client};
use attune_cli::output::{shown, text};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{encode, print, print_list};
use crate::Output;

/// A worker as the API answers it: the fields of `db::worker::WorkerView` this command shows
/// (that type cannot be read back: its `health` is a `&'static str`).
#[derive(Debug, Deserialize)]
pub struct Worker {
    pub id: i64,
    pub name: String,
    pub status: String,
    /// healthy, degraded or unhealthy
    pub health: String,
    pub queue_depth: i64,
    pub heartbeat_age_secs: Option<f64>,
    pub runtimes: Vec<String>,
    /// As the worker reports it (JSON in `WorkerView` too): its `health` counts.
    pub capabilities: Value,
    pub drained_at: Option<DateTime<Utc>>,
}

/// `attune worker list`
pub async fn list(client: &Client, out: Output) -> anyhow::Result<i32> {
    let workers: Vec<Answer<Worker>> = client.get("/api/v1/workers", &[]).await?;
    let headers =
        ["id", "name", "status", "health", "queue", "failures in a row", "runs failed", "heartbeat", "runtimes"];
    print_list(out, &workers, &headers, |w| {
        let health = &w.capabilities["health"];
        vec![
            w.id.to_string(),
            w.name.clone(),
            if w.drained_at.is_some() { format!("{} (drained)", w.status) } else { w.status.clone() },
            w.health.clone(),
            w.queue_depth.to_string(),
            text(&health["consecutive_failures"]),
            format!("{} of {}", text(&health["failed_executions"]), text(&health["total_executions"])),
            w.heartbeat_age_secs.map(|a| format!("{a:.1}s")).unwrap_or_else(|| "-".into()),
            w.runtimes.join(","),
        ]
    });
    Ok(0)
}

/// `attune worker drain NAME`
pub async fn drain(client: &Client, out: Output, name: &str) -> anyhow::Result<i32> {
    let worker: Answer<Worker> = client.put(&format!("/api/v1/workers/{}/drain", encode(name)), &json!({})).await?;
    print(out, &worker, |w| format!("worker {} drained: it finishes what it holds and is given nothing new", w.name));
    Ok(0)
}

/// `attune worker undrain NAME`
pub async fn undrain(client: &Client, out: Output, name: &str) -> anyhow::Result<i32> {
    let worker: Answer<Worker> = client.delete(&format!("/api/v1/workers/{}/drain", encode(name))).await?;
    print(out, &worker, |w| format!("worker {} undrained: it is given work again", w.name));
    Ok(0)
}

/// `attune config`: the retry and health settings the executors run with.
pub async fn config(client: &Client, out: Output) -> anyhow::Result<i32> {
    let config: Answer<EffectiveConfig> = client.get("/api/v1/config", &[]).await?;
    print(out, &config, |c| {
        let (retry, health) = (&c.retry, &c.health);
        format!(
            "retry   enabled {}  backoff {} s, times {} per retry, at most {} s, jitter {}\nhealth  enabled {}  degraded at {} failures / queue {}  unhealthy at {} / {}  heartbeat max age {}s",
            retry.enabled,
            shown(&retry.base_backoff_secs),
            shown(&retry.backoff_multiplier),
            shown(&retry.max_backoff_secs),
            shown(&retry.jitter_factor),
            text(&health["enabled"]),
            text(&health["degraded_threshold"]),
            text(&health["queue_depth_degraded"]),
            text(&health["unhealthy_threshold"]),
            text(&health["queue_depth_unhealthy"]),
            text(&health["heartbeat_max_age_secs"])
        )
    });
    Ok(0)
}
