//! The `events` workload (issue 49): webhook deliveries through the `bench` pack's webhook
//! (`bench_hook`) and rules (`on_delivery`, `on_alert`, both running `core.noop`).
//!
//! - deliveries at 200/s with 10 % redeliveries (a delivery id sent again): exactly one execution
//!   per unique delivery id answered `2xx`;
//! - deliveries at 50/s: from the event's commit (`event.received`, the start of the
//!   transaction the `2xx` waits for) to the execution `running` (`started`, the worker's claim),
//!   by the record: p50, p99;
//! - 1,000 alerts for 10 hosts, 50 at a time, under the rule's 10-minute cooldown per host:
//!   exactly 10 executions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use attune_common::db;
use serde_json::{Value, json};

use crate::workloads::{Bench, Measured};

pub(crate) async fn run(bench: &Bench, quick: bool) -> anyhow::Result<Vec<Measured>> {
    let (status, set) = {
        let response = bench
            .http
            .put(format!("{}/api/v1/webhooks/bench_hook/credential", bench.api))
            .bearer_auth(&bench.token)
            .json(&json!({}))
            .send()
            .await?;
        (response.status(), response.json::<Value>().await?)
    };
    if !status.is_success() {
        bail!("setting the bench_hook webhook's token: {status} {set} (is the bench pack registered?)");
    }
    let token: Arc<str> = set["token"].as_str().context("no token made")?.into();
    let run = format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_micros());
    let mut out = Vec::new();
    out.push(redeliveries(bench, &token, &run, 200.0, if quick { 5.0 } else { 300.0 }).await?);
    // 200 deliveries a second make more work than this machine runs: the latency is measured once
    // that backlog has run, not behind it
    let drained = Instant::now();
    drain(bench, Duration::from_secs(1200)).await?;
    eprintln!(
        "events: the executions of the redelivery run finished {:.1} s after it",
        drained.elapsed().as_secs_f64()
    );
    out.push(latency(bench, &token, &run, 50.0, if quick { 5.0 } else { 30.0 }).await?);
    out.push(cooldown(bench, &token, &run, if quick { 200 } else { 1000 }, 10).await?);
    Ok(out)
}

/// Deliveries open loop at `rate` for `secs`, every tenth one a delivery id sent before; the ids
/// answered `2xx`.
async fn open_loop(
    bench: &Bench,
    token: &Arc<str>,
    prefix: &str,
    rate: f64,
    secs: f64,
) -> anyhow::Result<(BTreeSet<String>, usize, usize)> {
    let total = (rate * secs) as usize;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = tokio::task::JoinSet::new();
    let bench_http = (bench.http.clone(), bench.api.clone());
    for n in 0..total {
        tick.tick().await;
        // every tenth is a redelivery of one sent a little before
        let id = if n % 10 == 9 { n - 5 } else { n };
        let delivery = format!("{prefix}-{id}");
        let payload = json!({"kind": "delivery", "n": id});
        let (http, api, token) = (bench_http.0.clone(), bench_http.1.clone(), token.clone());
        sent.spawn(async move {
            let status = deliver(&http, &api, &token, &delivery, &payload).await;
            (delivery, status)
        });
    }
    let (mut answered, mut failed) = (BTreeSet::new(), 0);
    while let Some(done) = sent.join_next().await {
        let (delivery, status) = done?;
        if (200..300).contains(&status) {
            answered.insert(delivery);
        } else {
            failed += 1;
        }
    }
    Ok((answered, total, failed))
}

/// Waits until no execution is unfinished.
async fn drain(bench: &Bench, deadline: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + deadline;
    loop {
        let left = db::bench::unfinished(&bench.db).await?;
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{left} executions still unfinished after {} s", deadline.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One delivery to `bench_hook`: the status it was answered with (0: no answer).
async fn deliver(http: &reqwest::Client, api: &str, token: &str, delivery: &str, payload: &Value) -> u16 {
    let response = http
        .post(format!("{api}/api/v1/webhooks/bench_hook"))
        .header("x-attune-webhook-token", token)
        .header("x-delivery-id", delivery)
        .json(payload)
        .send()
        .await;
    response.map(|r| r.status().as_u16()).unwrap_or(0)
}

/// The executions the rule `rule` made for events whose delivery starts with `prefix`.
async fn made(bench: &Bench, rule: &str, prefix: &str) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(db::bench::rule_executions(&bench.db, rule, prefix).await?)
}

async fn redeliveries(bench: &Bench, token: &Arc<str>, run: &str, rate: f64, secs: f64) -> anyhow::Result<Measured> {
    let prefix = format!("{run}-r");
    let started = Instant::now();
    let (answered, total, failed) = open_loop(bench, token, &prefix, rate, secs).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let made = made(bench, "bench.on_delivery", &prefix).await?;
    let per_delivery: BTreeSet<&String> = made.iter().map(|(d, _)| d).collect();
    let exact = made.len() == answered.len() && per_delivery.len() == answered.len();
    let name = format!("events: {rate}/s for {secs} s, 10 % redelivered");
    let extra = json!({
        "deliveries": total, "unique_answered": answered.len(), "refused": failed,
        "executions": made.len(), "one_per_unique_delivery": exact,
    });
    eprintln!("{name}: {extra}");
    if !exact {
        bail!("{name}: {} executions for {} unique deliveries answered 2xx", made.len(), answered.len());
    }
    Ok(Measured::new(&name, made.len(), elapsed, Vec::new(), failed, extra))
}

async fn latency(bench: &Bench, token: &Arc<str>, run: &str, rate: f64, secs: f64) -> anyhow::Result<Measured> {
    let prefix = format!("{run}-l");
    let started = Instant::now();
    let (answered, _, failed) = open_loop(bench, token, &prefix, rate, secs).await?;
    let elapsed = started.elapsed().as_secs_f64();
    // (every execution running or done: its `started` is set)
    let deadline = Instant::now() + Duration::from_secs(60);
    let latencies: Vec<f64> = loop {
        let rows = db::bench::event_to_start_ms(&bench.db, "bench.on_delivery", &prefix).await?;
        if rows.len() == answered.len() && rows.iter().all(Option::is_some) {
            break rows.into_iter().flatten().collect();
        }
        if Instant::now() > deadline {
            bail!(
                "{} of {} executions of the latency run did not start within 60 s",
                answered.len() - rows.len(),
                answered.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let name = format!("events: {rate}/s, event committed to running");
    Ok(Measured::new(&name, latencies.len(), elapsed, latencies, failed, json!({"offered": rate})))
}

async fn cooldown(bench: &Bench, token: &Arc<str>, run: &str, alerts: usize, hosts: usize) -> anyhow::Result<Measured> {
    let prefix = format!("{run}-c");
    let started = Instant::now();
    let mut sent = tokio::task::JoinSet::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(50));
    for n in 0..alerts {
        let (permit, delivery) = (gate.clone().acquire_owned().await?, format!("{prefix}-{n}"));
        let payload = json!({"kind": "alert", "host": format!("{run}-host-{}", n % hosts)});
        let (http, api, token) = (bench.http.clone(), bench.api.clone(), token.clone());
        sent.spawn(async move {
            let _permit = permit;
            deliver(&http, &api, &token, &delivery, &payload).await
        });
    }
    let mut refused = 0;
    while let Some(status) = sent.join_next().await {
        refused += usize::from(!(200..300).contains(&status?));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let made = made(bench, "bench.on_alert", &prefix).await?;
    let name = format!("events: {alerts} alerts for {hosts} hosts, 10 min cooldown");
    let extra = json!({"alerts": alerts, "hosts": hosts, "executions": made.len(), "refused": refused});
    eprintln!("{name}: {extra}");
    if made.len() != hosts {
        bail!("{name}: {} executions, not {hosts}", made.len());
    }
    Ok(Measured::new(&name, made.len(), elapsed, Vec::new(), refused, extra))
}
