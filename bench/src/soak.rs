//! `--soak MINUTES`: whether attune stays flat over a long run. `core.noop` is submitted open
//! loop at `--rate` (300/s by default) for MINUTES; every 30 s a line says how many executions
//! finished in the interval (and their rate), and the execution table's row count and sizes
//! (`pg_table_size`, `pg_indexes_size`, `pg_total_relation_size`). At the end: whether the sizes
//! over the last 10 minutes (the last third of a shorter run) stayed within 10 % of each other
//! (max / min ≤ 1.10), and whether every interval's rate stayed within 10 % of the offered rate.
//!
//! Retention runs inside attune (the executor); the soak only measures it. It is meant for
//! attune started with short retention ages, e.g. `ATTUNE_RETENTION_COMPLETED=2m
//! ATTUNE_RETENTION_FAILED=2m ATTUNE_HISTORY_INTERVAL_SECS=10`, so that the table reaches its
//! steady size within the run. An execution counts as finished when its row says so, or when its
//! row is gone (retention deletes only finished executions); its latency (submission to end) is
//! known only when its row was seen finished. The result states PostgreSQL's `autovacuum`
//! setting, off on these machines and on in production: what the table's sizes do depends on it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use attune_common::db;
use serde_json::{Value, json};

use crate::history::{bytes, thousands};
use crate::workloads::Bench;

/// A line every this often.
const REPORT_EVERY: Duration = Duration::from_secs(30);
/// How often the pending executions are looked up.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// The most pending executions (the oldest) looked up at once.
const POLL_BATCH: usize = 5000;
/// How long the end waits for the last executions to finish.
const DRAIN: Duration = Duration::from_secs(60);
/// The sizes are judged over the last this many seconds (or the last third of a shorter run).
const SIZE_WINDOW_SECS: f64 = 600.0;
/// Flat: max / min of each size over the window at most this.
const SIZE_MAX_OVER_MIN: f64 = 1.10;
/// Flat: each interval's rate within this fraction of the offered rate.
const RATE_TOLERANCE: f64 = 0.10;

/// What one interval saw.
#[derive(Default)]
struct Tally {
    offered: u64,
    finished: u64,
    not_completed: u64,
    /// Finished executions whose row was already gone when looked up.
    gone: u64,
    submit_errors: u64,
    latencies_ms: Vec<f64>,
}

fn epoch_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Looks up the oldest pending executions; those finished (or gone) leave `pending` and are
/// counted in `tally`.
async fn poll(bench: &Bench, pending: &mut BTreeMap<i64, f64>, tally: &mut Tally) -> anyhow::Result<()> {
    let ids: Vec<i64> = pending.keys().take(POLL_BATCH).copied().collect();
    if ids.is_empty() {
        return Ok(());
    }
    let rows = db::bench::finished(&bench.db, &ids).await?;
    let mut present = HashSet::new();
    for (id, finished, completed) in rows {
        present.insert(id);
        if let Some(finished) = finished
            && let Some(submitted) = pending.remove(&id)
        {
            tally.finished += 1;
            tally.not_completed += u64::from(!completed);
            tally.latencies_ms.push((finished - submitted) * 1000.0);
        }
    }
    for id in ids {
        if !present.contains(&id) {
            pending.remove(&id);
            tally.finished += 1;
            tally.gone += 1;
        }
    }
    Ok(())
}

/// Closes an interval: the table's rows and sizes now, a line printed, the interval as JSON.
async fn close(bench: &Bench, tally: Tally, elapsed: f64, secs: f64, pending: usize) -> anyhow::Result<Value> {
    let rows = db::bench::execution_count(&bench.db).await?;
    let (table, indexes, total) = db::bench::execution_table_sizes(&bench.db).await?;
    let rate = tally.finished as f64 / secs;
    let ms = |p: f64| percentile(&tally.latencies_ms, p).map_or("-".to_string(), |v| format!("{v:.1}"));
    println!(
        "soak {:>8.0} s {:>8} {:>9.1} {:>7} {:>7} {:>8} {:>8} {:>11} {:>11} {:>11} {:>11}",
        elapsed,
        tally.finished,
        rate,
        tally.not_completed,
        tally.submit_errors,
        ms(50.0),
        ms(99.0),
        thousands(rows),
        bytes(table),
        bytes(indexes),
        bytes(total)
    );
    let round = |v: Option<f64>| v.map(|v| (v * 100.0).round() / 100.0);
    Ok(json!({
        "elapsed_secs": (elapsed * 10.0).round() / 10.0,
        "secs": (secs * 10.0).round() / 10.0,
        "offered": tally.offered,
        "finished": tally.finished,
        "rate": (rate * 100.0).round() / 100.0,
        "not_completed": tally.not_completed,
        "gone_before_seen": tally.gone,
        "submit_errors": tally.submit_errors,
        "latency_ms": {"p50": round(percentile(&tally.latencies_ms, 50.0)), "p99": round(percentile(&tally.latencies_ms, 99.0))},
        "pending": pending,
        "rows": rows,
        "table_bytes": table,
        "index_bytes": indexes,
        "total_bytes": total,
    }))
}

/// The soak: `minutes` of `core.noop` at `rate` per second. Returns the report's `soak` section.
pub(crate) async fn run(bench: &Arc<Bench>, minutes: f64, rate: f64) -> anyhow::Result<Value> {
    if !(minutes > 0.0 && minutes.is_finite()) {
        bail!("--soak needs a positive number of minutes");
    }
    if !(rate > 0.0 && rate.is_finite()) {
        bail!("--rate must be positive");
    }
    let (autovacuum, reloptions) = db::bench::vacuum_settings(&bench.db).await?;
    println!(
        "soak: core.noop at {rate}/s offered for {minutes} min; PostgreSQL autovacuum {autovacuum}{}",
        if reloptions.is_empty() { String::new() } else { format!(" (execution: {})", reloptions.join(", ")) }
    );
    println!(
        "soak {:>10} {:>8} {:>9} {:>7} {:>7} {:>8} {:>8} {:>11} {:>11} {:>11} {:>11}",
        "elapsed", "finished", "per s", "not ok", "errors", "p50 ms", "p99 ms", "rows", "table", "indexes", "total"
    );
    let duration = Duration::from_secs_f64(minutes * 60.0);
    let (sender, mut submitted) = tokio::sync::mpsc::unbounded_channel::<(i64, f64)>();
    let offered = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let started = Instant::now();
    let submitter = {
        let (bench, offered, errors, first_error) =
            (bench.clone(), offered.clone(), errors.clone(), first_error.clone());
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            loop {
                ticker.tick().await;
                if started.elapsed() >= duration {
                    return;
                }
                offered.fetch_add(1, Ordering::Relaxed);
                let (bench, sender, errors, first_error) =
                    (bench.clone(), sender.clone(), errors.clone(), first_error.clone());
                tokio::spawn(async move {
                    let submitted = epoch_now();
                    match bench.submit("core.noop", &json!({})).await {
                        Ok((id, _)) => {
                            let _ = sender.send((id, submitted));
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            first_error.lock().unwrap().get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                });
            }
        })
    };
    let mut pending: BTreeMap<i64, f64> = BTreeMap::new();
    let mut intervals = Vec::new();
    let mut tally = Tally::default();
    let (mut offered_before, mut errors_before) = (0, 0);
    let mut interval_start = 0.0;
    let mut ticker = tokio::time::interval(POLL_EVERY);
    let mut next_report = REPORT_EVERY.min(duration);
    let mut closed = false;
    // the measured run, then the drain: until every submission finished, or `DRAIN` passed
    let mut drain = None;
    loop {
        ticker.tick().await;
        loop {
            match submitted.try_recv() {
                Ok((id, at)) => {
                    pending.insert(id, at);
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        poll(bench, &mut pending, &mut tally).await?;
        let elapsed = started.elapsed();
        let mut take = |tally: &mut Tally| {
            let (o, e) = (offered.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
            tally.offered = o - offered_before;
            tally.submit_errors = e - errors_before;
            (offered_before, errors_before) = (o, e);
            std::mem::take(tally)
        };
        if drain.is_none() && elapsed >= next_report {
            let secs = elapsed.as_secs_f64();
            intervals.push(close(bench, take(&mut tally), secs, secs - interval_start, pending.len()).await?);
            interval_start = secs;
            if next_report >= duration {
                drain = Some(Instant::now());
            } else {
                next_report = (next_report + REPORT_EVERY).min(duration);
            }
        }
        if let Some(since) = drain
            && ((closed && pending.is_empty()) || since.elapsed() >= DRAIN)
        {
            let secs = started.elapsed().as_secs_f64();
            println!("soak: the end, after submissions stopped:");
            let last = close(bench, take(&mut tally), secs, secs - interval_start, pending.len()).await?;
            submitter.abort();
            return Ok(section(minutes, rate, &autovacuum, &reloptions, intervals, last, &first_error));
        }
    }
}

/// The report's `soak` section, with its verdicts (printed as they are made).
fn section(
    minutes: f64,
    rate: f64,
    autovacuum: &str,
    reloptions: &[String],
    intervals: Vec<Value>,
    drain: Value,
    first_error: &std::sync::Mutex<Option<String>>,
) -> Value {
    let total = minutes * 60.0;
    let window = SIZE_WINDOW_SECS.min(total / 3.0);
    let tail: Vec<&Value> =
        intervals.iter().filter(|i| i["elapsed_secs"].as_f64().unwrap_or(0.0) >= total - window - 0.5).collect();
    let spread = |key: &str| -> Option<f64> {
        let values: Vec<f64> = tail.iter().filter_map(|i| i[key].as_f64()).collect();
        let (min, max) = values.iter().fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        (values.len() >= 2 && min > 0.0).then(|| (max / min * 1000.0).round() / 1000.0)
    };
    let (table, indexes, total_size, rows) =
        (spread("table_bytes"), spread("index_bytes"), spread("total_bytes"), spread("rows"));
    let sizes_flat = match (table, indexes, total_size) {
        (Some(t), Some(i), Some(a)) => Some(t <= SIZE_MAX_OVER_MIN && i <= SIZE_MAX_OVER_MIN && a <= SIZE_MAX_OVER_MIN),
        _ => None,
    };
    let rates: Vec<f64> = intervals.iter().filter_map(|i| i["rate"].as_f64()).collect();
    let off_by = rates.iter().map(|r| (r - rate).abs() / rate).fold(0.0, f64::max);
    let throughput_flat = (!rates.is_empty()).then_some(off_by <= RATE_TOLERANCE);
    let sum = |key: &str| intervals.iter().chain([&drain]).filter_map(|i| i[key].as_u64()).sum::<u64>();
    json!({
        "minutes": minutes,
        "offered_rate": rate,
        "autovacuum": autovacuum,
        "execution_reloptions": reloptions,
        "interval_secs": REPORT_EVERY.as_secs(),
        "intervals": intervals,
        "drain": drain,
        "size_window_secs": window,
        "size_samples": tail.len(),
        "targets": {"size_max_over_min": SIZE_MAX_OVER_MIN, "rate_tolerance": RATE_TOLERANCE},
        "table_max_over_min": table,
        "index_max_over_min": indexes,
        "total_max_over_min": total_size,
        "rows_max_over_min": rows,
        "rate_min": rates.iter().cloned().reduce(f64::min),
        "rate_max": rates.iter().cloned().reduce(f64::max),
        "rate_worst_off_by": (off_by * 1000.0).round() / 1000.0,
        "finished": sum("finished"),
        "not_completed": sum("not_completed"),
        "submit_errors": sum("submit_errors"),
        "first_submit_error": first_error.lock().unwrap().clone(),
        "verdicts": {"sizes_flat": sizes_flat, "throughput_flat": throughput_flat},
    })
}

/// The soak's verdicts for people (its intervals were printed as they closed).
pub(crate) fn table(soak: &Value) -> String {
    let ok = |v: &Value| match v.as_bool() {
        Some(true) => "ok",
        Some(false) => "MISSED",
        None => "not judged (too few intervals)",
    };
    let ratio = |key: &str| soak[key].as_f64().map_or("-".to_string(), |v| format!("{v:.3}"));
    let rate = |key: &str| soak[key].as_f64().map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut out = format!(
        "soak: {} min of core.noop at {}/s offered, PostgreSQL autovacuum {}; {} finished, {} not completed, \
         {} submissions refused\n",
        soak["minutes"],
        soak["offered_rate"],
        soak["autovacuum"].as_str().unwrap_or("?"),
        thousands(soak["finished"].as_i64().unwrap_or(0)),
        soak["not_completed"],
        soak["submit_errors"],
    );
    out += &format!(
        "soak: sizes over the last {:.0} s ({} samples), max / min: table {}, indexes {}, total {} (rows {}); \
         target <= {SIZE_MAX_OVER_MIN}: {}\n",
        soak["size_window_secs"].as_f64().unwrap_or(0.0),
        soak["size_samples"],
        ratio("table_max_over_min"),
        ratio("index_max_over_min"),
        ratio("total_max_over_min"),
        ratio("rows_max_over_min"),
        ok(&soak["verdicts"]["sizes_flat"]),
    );
    out += &format!(
        "soak: throughput per interval {} to {}/s, at worst {:.1} % off the offered rate; target within {:.0} %: {}\n",
        rate("rate_min"),
        rate("rate_max"),
        soak["rate_worst_off_by"].as_f64().unwrap_or(0.0) * 100.0,
        RATE_TOLERANCE * 100.0,
        ok(&soak["verdicts"]["throughput_flat"]),
    );
    if let Some(error) = soak["first_submit_error"].as_str() {
        out += &format!("soak: the first refused submission: {error}\n");
    }
    out
}
