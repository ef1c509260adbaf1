//! The `history` workload (`--workload history`): what days of finished executions cost attune.
//! It measures the same things twice in one run, back to back: first with the execution table as
//! found (empty in `make bench`'s fresh database, but for the first measurement's own
//! executions), then after loading `--history-rows` finished executions (10 million by default)
//! straight into PostgreSQL, as the last `--history-days` days (6 by default) of a busy
//! installation would have left them.
//!
//! Each time it measures, beside its target:
//! - `core.noop` at maximum rate (`--count` executions by `--concurrency` clients, as the `noop`
//!   workload): the ratio with history to without, target ≥ 0.9;
//! - p50, p95 and max of 50 sequential requests (after 3 warm-ups) of each read route the
//!   dashboard and an operator use, with the benchmark's token: target p95 ≤ 100 ms, `/metrics`
//!   ≤ 50 ms;
//! - `/metrics` while 20 clients scrape it in a loop for 10 s, with an authenticated
//!   `GET /api/v1/executions/{id}` measured at the same time: target p95 ≤ 50 ms and ≤ 100 ms;
//! - the quick reference's SQL (Examples 1 to 3 and the two monitoring queries, kept verbatim in
//!   `db::bench`), Example 1 for a loaded chain's root (bound as `$1` in place of its `100`),
//!   through the benchmark's connection, 5 runs each: target max < 100 ms;
//! - every 5xx answer: target none.
//!
//! The loader (`db::bench::load_history_chunk`) inserts with `INSERT ... SELECT FROM
//! generate_series`, `LOAD_CHUNK` rows per statement, each statement its own transaction; then
//! `VACUUM ANALYZE execution`, and `execution_rollup_rebuild()` where the schema has it (the
//! statistics' rollups, which a load behind the services' back leaves stale). The mix, by
//! position in each run of 100 rows: 60 `core.echo` completed, 24 `core.noop` completed,
//! 10 `core.fail` failed (`action_failed`), and 3 retry chains of `core.flaky`: an original failed
//! with `transient_error` and, in the next position, its retry (retry count 1,
//! `original_execution` the original, the reason in `retry_reason` and in `config`), completed.
//! Ids come from the table's own sequence in position order within one statement, so a retry
//! names its original by the id `lag()` finds for the position before it, and the foreign key is
//! checked (at the statement's end) against a row of the same statement; a chunk is a multiple of
//! 100 rows, so it never splits a chain. `created` steps evenly from `--history-days` days before
//! the load began to just before it; an attempt starts a few milliseconds after it was created (a
//! retry after a backoff of about 1 s from its original's end), runs a few milliseconds, and was
//! last updated when it finished.
//!
//! attune's own retention (the executor's history job) removes what is older than its ages
//! (`ATTUNE_RETENTION_*`) while this runs: each measurement records the table's rows at its start
//! and at its end. Completed executions go after 7 days by default (`ATTUNE_RETENTION_COMPLETED`),
//! which is why the history spans 6 days by default: an older one would be removed while it is
//! being measured.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use attune_common::db;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::workloads::{Bench, BenchArgs, Measured};

/// Rows per loading statement (and transaction): a multiple of 100, the period of the mix.
const LOAD_CHUNK: u64 = 250_000;

/// Targets.
const NOOP_RATIO_MIN: f64 = 0.9;
const READ_P95_MS: f64 = 100.0;
const METRICS_P95_MS: f64 = 50.0;
const SQL_MAX_MS: f64 = 100.0;

/// Clients scraping `/metrics` at once in the concurrent measurement.
const SCRAPERS: usize = 20;

/// The quick reference's queries (kept verbatim in `db::bench`), in the report's order.
#[derive(Clone, Copy)]
enum Reference {
    /// Example 1, for a chain's root instead of `100`.
    ViewRetryChain,
    AnalyzeRetrySuccessRate,
    FindWorkersByHealth,
    RetryRateLastHour,
    WorkerHealthDistribution,
}

impl Reference {
    const ALL: [Reference; 5] = [
        Reference::ViewRetryChain,
        Reference::AnalyzeRetrySuccessRate,
        Reference::FindWorkersByHealth,
        Reference::RetryRateLastHour,
        Reference::WorkerHealthDistribution,
    ];

    fn name(self) -> &'static str {
        match self {
            Reference::ViewRetryChain => "Example 1: View Retry Chain",
            Reference::AnalyzeRetrySuccessRate => "Example 2: Analyze Retry Success Rate",
            Reference::FindWorkersByHealth => "Example 3: Find Workers by Health",
            Reference::RetryRateLastHour => "Retry rate over last hour",
            Reference::WorkerHealthDistribution => "Worker health distribution",
        }
    }

    /// Runs the query once (`root`: the chain Example 1 reads); the rows it read.
    async fn run(self, db: &PgPool, root: i64) -> Result<usize, sqlx::Error> {
        match self {
            Reference::ViewRetryChain => db::bench::quick_reference_example_1(db, root).await,
            Reference::AnalyzeRetrySuccessRate => db::bench::quick_reference_example_2(db).await,
            Reference::FindWorkersByHealth => db::bench::quick_reference_example_3(db).await,
            Reference::RetryRateLastHour => db::bench::retry_rate_last_hour(db).await,
            Reference::WorkerHealthDistribution => db::bench::worker_health_distribution(db).await,
        }
    }
}

/// How many samples each measurement takes (fewer with `--quick`).
struct Sizing {
    warmups: usize,
    requests: usize,
    scrape_secs: f64,
    sql_runs: usize,
}

/// The samples of one measurement, in milliseconds, and how its requests went.
#[derive(Default)]
struct Timed {
    /// What was measured, the same in both phases.
    name: String,
    /// The request or statement itself, when it says more than the name.
    detail: Option<String>,
    samples_ms: Vec<f64>,
    /// Answers with a 5xx status.
    server_errors: usize,
    /// Any other failure: another status than 2xx, a transport or SQL error.
    other_errors: usize,
    /// Why there are no samples, or the first failure.
    note: Option<String>,
}

impl Timed {
    fn named(name: &str) -> Timed {
        Timed { name: name.to_string(), ..Default::default() }
    }

    fn percentile(&self, p: f64) -> Option<f64> {
        let mut sorted = self.samples_ms.clone();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            return None;
        }
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    /// Records one answer (`None`: no answer at all, `error` says why).
    fn record(&mut self, ms: f64, status: Option<u16>, error: impl FnOnce() -> String) {
        match status {
            Some(s) if (200..300).contains(&s) => {}
            Some(s) if s >= 500 => self.server_errors += 1,
            _ => self.other_errors += 1,
        }
        if !status.is_some_and(|s| (200..300).contains(&s)) && self.note.is_none() {
            self.note = Some(error());
        }
        self.samples_ms.push(ms);
    }

    fn to_json(&self) -> Value {
        let round = |v: Option<f64>| v.map(|v| (v * 100.0).round() / 100.0);
        json!({
            "name": self.name,
            "detail": self.detail,
            "n": self.samples_ms.len(),
            "p50_ms": round(self.percentile(50.0)),
            "p95_ms": round(self.percentile(95.0)),
            "max_ms": round(self.percentile(100.0)),
            "server_errors": self.server_errors,
            "other_errors": self.other_errors,
            "note": self.note,
        })
    }
}

/// `n` with thousands separators.
pub(crate) fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// `bytes` in MiB or GiB.
pub(crate) fn bytes(bytes: i64) -> String {
    let mib = bytes as f64 / 1048576.0;
    if mib >= 1024.0 { format!("{:.2} GiB", mib / 1024.0) } else { format!("{mib:.1} MiB") }
}

/// What the load did.
struct Loaded {
    rows: u64,
    /// The load's start, epoch seconds: every loaded row was created before it.
    started_epoch: f64,
    section: Value,
}

/// Loads `rows` finished executions spread evenly over the `days` before the load (see the
/// module's doc), then vacuums, analyzes and rebuilds the rollups. Needs the database only.
async fn load(db: &PgPool, rows: u64, days: f64) -> anyhow::Result<Loaded> {
    let now = db::now(db).await?;
    let started_epoch = now.timestamp_micros() as f64 / 1e6;
    let workers = db::bench::real_worker_ids(db).await?;
    let mut actions = [None; 4];
    for (id, action) in actions.iter_mut().zip(["core.echo", "core.noop", "core.fail", "core.flaky"]) {
        *id = db::bench::action_id(db, action).await?;
    }
    let history = db::bench::HistoryLoad {
        rows: rows as i64,
        start_epoch: started_epoch - days * 86400.0,
        step_secs: days * 86400.0 / rows as f64,
        workers: &workers,
        actions,
    };
    eprintln!(
        "history: loading {} finished executions over the last {days} days, {} rows per statement",
        thousands(rows as i64),
        thousands(LOAD_CHUNK as i64)
    );
    let started = Instant::now();
    let mut done = 0u64;
    while done < rows {
        let end = (done + LOAD_CHUNK).min(rows);
        db::bench::load_history_chunk(db, &history, done as i64, end as i64)
            .await
            .with_context(|| format!("loading rows {done} to {end}"))?;
        done = end;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "history: {} of {} rows ({:.1} %) in {secs:.1} s, {} rows/s",
            thousands(done as i64),
            thousands(rows as i64),
            100.0 * done as f64 / rows as f64,
            thousands((done as f64 / secs) as i64)
        );
    }
    let insert_secs = started.elapsed().as_secs_f64();
    let vacuum = Instant::now();
    db::bench::vacuum_analyze_execution(db).await.context("VACUUM ANALYZE execution")?;
    let vacuum_secs = vacuum.elapsed().as_secs_f64();
    eprintln!("history: VACUUM ANALYZE execution took {vacuum_secs:.1} s");
    let rollup = db::bench::rollup_rebuild_exists(db).await?;
    // (a failed rebuild is reported, not fatal: the load behind it took long)
    let (mut rollup_secs, mut rollup_error) = (None, None);
    if rollup {
        let rebuild = Instant::now();
        match db::bench::rollup_rebuild(db).await {
            Ok(()) => {
                let secs = rebuild.elapsed().as_secs_f64();
                eprintln!("history: execution_rollup_rebuild() took {secs:.1} s");
                rollup_secs = Some(secs);
            }
            Err(e) => {
                eprintln!("history: SELECT execution_rollup_rebuild() failed: {e}");
                rollup_error = Some(e.to_string());
            }
        }
    } else {
        eprintln!("history: no execution_rollup_rebuild() in this schema: no rollups rebuilt");
    }
    let total_secs = started.elapsed().as_secs_f64();
    let (table, indexes, total) = db::bench::execution_table_sizes(db).await?;
    eprintln!(
        "history: loaded {} rows in {total_secs:.1} s (inserts {insert_secs:.1} s, {} rows/s); execution: table {}, \
         indexes {}, total {}",
        thousands(rows as i64),
        thousands((rows as f64 / insert_secs) as i64),
        bytes(table),
        bytes(indexes),
        bytes(total)
    );
    let round = |v: f64| (v * 10.0).round() / 10.0;
    Ok(Loaded {
        rows,
        started_epoch,
        section: json!({
            "rows": rows,
            "rows_per_statement": LOAD_CHUNK,
            "days": days,
            "seconds": round(total_secs),
            "insert_seconds": round(insert_secs),
            "rows_per_second": (rows as f64 / insert_secs).round(),
            "vacuum_analyze_seconds": round(vacuum_secs),
            "rollup_rebuild": rollup,
            "rollup_rebuild_seconds": rollup_secs.map(round),
            "rollup_rebuild_error": rollup_error,
            "table_bytes": table,
            "index_bytes": indexes,
            "total_bytes": total,
        }),
    })
}

/// An execution of a retry chain to read (a retry, and its chain's root): from the loaded
/// history when there is one (the newest retry created a day or more before the load, so not
/// among the last rows written), else the newest retry in the table, else the newest execution.
async fn pick_execution(bench: &Bench, loaded: Option<&Loaded>) -> anyhow::Result<(i64, i64)> {
    let mut id: Option<i64> = None;
    if let Some(loaded) = loaded {
        id = db::bench::newest_flaky_retry(&bench.db, loaded.started_epoch - 86400.0).await?;
    }
    if id.is_none() {
        id = db::bench::newest_retry(&bench.db).await?;
    }
    if id.is_none() {
        id = db::bench::newest_execution(&bench.db).await?;
    }
    let id = id.context("the execution table is empty: no execution to read")?;
    let root = db::bench::chain_root(&bench.db, id).await?.unwrap_or(id);
    Ok((id, root))
}

/// One GET: its time in milliseconds, and its status and body (or why there is none).
async fn get(bench: &Bench, url: &str, authenticated: bool) -> (f64, Result<(u16, Vec<u8>), String>) {
    let started = Instant::now();
    let mut request = bench.http.get(url).timeout(Duration::from_secs(120));
    if authenticated {
        request = request.bearer_auth(&bench.token);
    }
    let answer = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            response.bytes().await.map(|body| (status, body.to_vec())).map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    (started.elapsed().as_secs_f64() * 1000.0, answer)
}

/// `sizing.requests` sequential GETs of `path` after `sizing.warmups` unmeasured ones.
async fn measure_route(bench: &Bench, name: &str, path: &str, sizing: &Sizing) -> Timed {
    let url = format!("{}{path}", bench.api);
    let mut timed = Timed::named(name);
    if name != path {
        timed.detail = Some(path.to_string());
    }
    for _ in 0..sizing.warmups {
        let _ = get(bench, &url, true).await;
    }
    for _ in 0..sizing.requests {
        let (ms, answer) = get(bench, &url, true).await;
        match answer {
            Ok((status, body)) => timed.record(ms, Some(status), || {
                format!("{path}: {status} {}", String::from_utf8_lossy(&body[..body.len().min(300)]))
            }),
            Err(e) => timed.record(ms, None, || format!("{path}: {e}")),
        }
    }
    timed
}

/// The path of the page after the first of `path` (a list): by its `next_cursor` when the
/// answer has one, else by its `next_offset`; `Err` says why there is none.
async fn next_page(bench: &Bench, path: &str) -> Result<String, String> {
    let (_, answer) = get(bench, &format!("{}{path}", bench.api), true).await;
    let (status, body) = answer?;
    if status != 200 {
        return Err(format!("the first page answered {status}"));
    }
    let page: Value = serde_json::from_slice(&body).map_err(|e| format!("the first page is not JSON: {e}"))?;
    let (param, value) = match (&page["next_cursor"], &page["next_offset"]) {
        (Value::String(cursor), _) => ("cursor", cursor.clone()),
        (Value::Number(cursor), _) => ("cursor", cursor.to_string()),
        (_, Value::Number(offset)) => ("offset", offset.to_string()),
        _ => return Err("one page only: the first has neither next_cursor nor next_offset".into()),
    };
    let mut url = reqwest::Url::parse(&format!("{}{path}", bench.api)).map_err(|e| e.to_string())?;
    url.query_pairs_mut().append_pair(param, &value);
    Ok(match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    })
}

/// The read routes, each `sizing.requests` times in turn; `id` an execution of a retry chain.
async fn measure_reads(bench: &Bench, id: i64, sizing: &Sizing) -> Vec<Timed> {
    let list = "/api/v1/executions?limit=50&action_ref=core.echo";
    let plain = |path: &str| (path.to_string(), path.to_string());
    let mut routes = vec![
        plain("/metrics"),
        plain("/api/v1/executions?limit=50"),
        plain("/api/v1/executions?limit=50&status=failed"),
    ];
    routes.push(plain(list));
    let next = next_page(bench, list).await;
    if let Ok(path) = &next {
        routes.push((format!("{list}, next page"), path.clone()));
    }
    routes.push(("/api/v1/executions/{id}".to_string(), format!("/api/v1/executions/{id}")));
    routes.push(("/api/v1/executions/{id}/chain".to_string(), format!("/api/v1/executions/{id}/chain")));
    routes.extend(
        [
            "/api/v1/stats/retries?window_secs=3600",
            "/api/v1/stats/retries?window_secs=604800",
            "/api/v1/stats/retries/series?window_secs=604800&buckets=30",
            "/api/v1/stats/workers",
            "/api/v1/workers",
            "/api/v1/actions",
        ]
        .map(plain),
    );
    let mut measured = Vec::new();
    for (name, path) in &routes {
        let timed = measure_route(bench, &format!("GET {name}"), path, sizing).await;
        eprintln!("history:   {}", line(&timed));
        measured.push(timed);
        if let (Err(why), true) = (&next, name == list) {
            let mut skipped = Timed::named(&format!("GET {list}, next page"));
            skipped.note = Some(why.clone());
            eprintln!("history:   {}", line(&skipped));
            measured.push(skipped);
        }
    }
    measured
}

/// `/metrics` scraped by `SCRAPERS` clients in a loop for `secs`, and an execution read by id
/// at the same time: (the scrapes, the reads).
async fn measure_scrape(bench: &Arc<Bench>, id: i64, secs: f64) -> anyhow::Result<(Timed, Timed)> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let client = |url: String, authenticated: bool, name: String| {
        let bench = bench.clone();
        tokio::spawn(async move {
            let mut timed = Timed::named(&name);
            while Instant::now() < deadline {
                let (ms, answer) = get(&bench, &url, authenticated).await;
                match answer {
                    Ok((status, body)) => timed.record(ms, Some(status), || {
                        format!("{url}: {status} {}", String::from_utf8_lossy(&body[..body.len().min(300)]))
                    }),
                    Err(e) => timed.record(ms, None, || format!("{url}: {e}")),
                }
            }
            timed
        })
    };
    let metrics_name = format!("/metrics, {SCRAPERS} clients scraping for {secs:.0} s");
    let scrapers: Vec<_> =
        (0..SCRAPERS).map(|_| client(format!("{}/metrics", bench.api), false, metrics_name.clone())).collect();
    let reader = client(
        format!("{}/api/v1/executions/{id}", bench.api),
        true,
        "GET /api/v1/executions/{id} meanwhile".to_string(),
    );
    let mut metrics = Timed::named(&metrics_name);
    for scraper in scrapers {
        let timed = scraper.await?;
        metrics.samples_ms.extend(timed.samples_ms);
        metrics.server_errors += timed.server_errors;
        metrics.other_errors += timed.other_errors;
        metrics.note = metrics.note.or(timed.note);
    }
    let reads = reader.await?;
    eprintln!("history:   {}", line(&metrics));
    eprintln!("history:   {}", line(&reads));
    Ok((metrics, reads))
}

/// The quick reference's SQL, `runs` times each, through the benchmark's own connection.
async fn measure_sql(bench: &Bench, root: i64, runs: usize) -> Vec<Timed> {
    let mut measured = Vec::new();
    for query in Reference::ALL {
        let mut timed = Timed::named(query.name());
        if let Reference::ViewRetryChain = query {
            timed.detail = Some(format!("WHERE id = $1, bound to {root}"));
        }
        for _ in 0..runs {
            let started = Instant::now();
            match query.run(&bench.db, root).await {
                Ok(_) => timed.samples_ms.push(started.elapsed().as_secs_f64() * 1000.0),
                Err(e) => {
                    timed.other_errors += 1;
                    timed.note.get_or_insert_with(|| format!("{e}"));
                }
            }
        }
        eprintln!("history:   SQL {}", line(&timed));
        measured.push(timed);
    }
    measured
}

/// A measurement in one line, for the progress on stderr.
fn line(timed: &Timed) -> String {
    let ms = |p: f64| timed.percentile(p).map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut out = format!(
        "{}: n {}, p50 {} ms, p95 {} ms, max {} ms",
        timed.name,
        timed.samples_ms.len(),
        ms(50.0),
        ms(95.0),
        ms(100.0)
    );
    if timed.server_errors + timed.other_errors > 0 {
        out += &format!(", 5xx {}, other failures {}", timed.server_errors, timed.other_errors);
    }
    if let Some(note) = &timed.note {
        out += &format!(" ({note})");
    }
    out
}

/// One phase: every measurement once, with the table as it is now.
async fn phase(
    bench: &Arc<Bench>,
    label: &str,
    loaded: Option<&Loaded>,
    count: usize,
    concurrency: usize,
    sizing: &Sizing,
) -> anyhow::Result<(Measured, Value)> {
    let rows = db::bench::execution_count(&bench.db).await?;
    let (table, indexes, total) = db::bench::execution_table_sizes(&bench.db).await?;
    eprintln!(
        "history: measuring {label}: {} rows in execution (table {}, indexes {})",
        thousands(rows),
        bytes(table),
        bytes(indexes)
    );
    let noop = bench
        .closed_loop(&format!("core.noop, max rate, {label}"), count, concurrency, &[(1.0, "core.noop", json!({}))])
        .await?;
    let noop_rate = noop.executions as f64 / noop.elapsed;
    eprintln!("history:   core.noop at maximum rate: {noop_rate:.1} executions/s");
    let (id, root) = pick_execution(bench, loaded).await?;
    eprintln!("history:   reading execution {id} (its chain's root: {root})");
    let reads = measure_reads(bench, id, sizing).await;
    let (scrapes, read_meanwhile) = measure_scrape(bench, id, sizing.scrape_secs).await?;
    let sql = measure_sql(bench, root, sizing.sql_runs).await;
    // (attune's retention may have removed history meanwhile)
    let rows_after = db::bench::execution_count(&bench.db).await?;
    if rows_after != rows {
        eprintln!("history:   {} rows in execution at the end of this measurement", thousands(rows_after));
    }
    let server_errors: usize = reads.iter().chain([&scrapes, &read_meanwhile]).map(|t| t.server_errors).sum();
    let section = json!({
        "label": label,
        "rows": rows,
        "rows_after": rows_after,
        "table_bytes": table,
        "index_bytes": indexes,
        "total_bytes": total,
        "execution": id,
        "chain_root": root,
        "noop_executions_per_second": (noop_rate * 100.0).round() / 100.0,
        "reads": reads.iter().map(Timed::to_json).collect::<Vec<_>>(),
        "scrape": {
            "clients": SCRAPERS,
            "seconds": sizing.scrape_secs,
            "metrics": scrapes.to_json(),
            "execution_by_id": read_meanwhile.to_json(),
        },
        "sql": sql.iter().map(Timed::to_json).collect::<Vec<_>>(),
        "server_errors": server_errors,
    });
    Ok((noop, section))
}

/// The `history` workload: the measurements without the loaded history, the load, and the
/// measurements again. Returns the two `core.noop` rows for the report's results, and its
/// `history` section.
pub(crate) async fn run(bench: &Arc<Bench>, args: &BenchArgs) -> anyhow::Result<(Vec<Measured>, Value)> {
    let q = args.quick;
    let rows = if q { args.history_rows.min(20_000) } else { args.history_rows };
    let days = args.history_days;
    if !(days > 0.0 && days.is_finite()) {
        bail!("--history-days must be a positive number of days");
    }
    let count = if q { 100 } else { args.count };
    if count == 0 {
        bail!("the history workload needs --count of at least 1");
    }
    let sizing = if q {
        Sizing { warmups: 1, requests: 10, scrape_secs: 2.0, sql_runs: 2 }
    } else {
        Sizing { warmups: 3, requests: 50, scrape_secs: 10.0, sql_runs: 5 }
    };
    let (autovacuum, reloptions) = db::bench::vacuum_settings(&bench.db).await?;
    eprintln!(
        "history: PostgreSQL autovacuum is {autovacuum}{}",
        if reloptions.is_empty() {
            String::new()
        } else {
            format!("; the execution table's own settings: {}", reloptions.join(", "))
        }
    );
    let found = db::bench::execution_count(&bench.db).await?;
    let without_label = format!("without history (as found: {} rows)", thousands(found));
    let (noop_without, without) = phase(bench, &without_label, None, count, args.concurrency, &sizing).await?;
    let mut measured = vec![noop_without];
    let mut phases = vec![without];
    let mut load_section = Value::Null;
    if rows > 0 {
        let loaded = load(&bench.db, rows, days).await?;
        load_section = loaded.section.clone();
        let label = format!("with {} rows of history", thousands(loaded.rows as i64));
        let (noop_with, with) = phase(bench, &label, Some(&loaded), count, args.concurrency, &sizing).await?;
        measured.push(noop_with);
        phases.push(with);
    } else {
        eprintln!("history: --history-rows 0: nothing loaded, one measurement only");
    }
    let rate = |m: &Measured| m.executions as f64 / m.elapsed;
    let ratio = (measured.len() == 2).then(|| rate(&measured[1]) / rate(&measured[0]));
    let mut section = json!({
        "rows_requested": rows,
        "load": load_section,
        "autovacuum": autovacuum,
        "execution_reloptions": reloptions,
        "targets": {
            "noop_ratio_min": NOOP_RATIO_MIN,
            "read_p95_ms_max": READ_P95_MS,
            "metrics_p95_ms_max": METRICS_P95_MS,
            "metrics_under_scrapers_p95_ms_max": METRICS_P95_MS,
            "sql_ms_max": SQL_MAX_MS,
            "server_errors_max": 0,
        },
        "phases": phases,
        "noop_ratio": ratio.map(|r| (r * 1000.0).round() / 1000.0),
    });
    section["verdicts"] = verdicts(&section);
    Ok((measured, section))
}

/// A measurement's failed requests or statements: 5xx answers and any other failure.
fn failures(measured: &Value) -> u64 {
    measured["server_errors"].as_u64().unwrap_or(0) + measured["other_errors"].as_u64().unwrap_or(0)
}

/// Whether every phase met each target (`null` where nothing was measured).
fn verdicts(section: &Value) -> Value {
    let phases = section["phases"].as_array().cloned().unwrap_or_default();
    let all = |check: &dyn Fn(&Value) -> Option<bool>| -> Value {
        let checked: Vec<bool> = phases.iter().filter_map(check).collect();
        if checked.is_empty() { Value::Null } else { Value::Bool(checked.iter().all(|ok| *ok)) }
    };
    let reads_ok = |phase: &Value, metrics: bool| -> Option<bool> {
        let checked: Vec<bool> = phase["reads"]
            .as_array()?
            .iter()
            .filter(|r| (r["name"] == "GET /metrics") == metrics)
            .filter_map(|r| Some((r["p95_ms"].as_f64()?, failures(r))))
            .map(|(p95, failures)| failures == 0 && p95 <= if metrics { METRICS_P95_MS } else { READ_P95_MS })
            .collect();
        (!checked.is_empty()).then(|| checked.iter().all(|ok| *ok))
    };
    let scrape_ok = |key: &str, limit: f64| {
        all(&|p| {
            let measured = &p["scrape"][key];
            measured["p95_ms"].as_f64().map(|p95| failures(measured) == 0 && p95 <= limit)
        })
    };
    let sql_ok = all(&|p| {
        let mut statements = p["sql"].as_array()?.iter();
        Some(statements.all(|s| failures(s) == 0 && s["max_ms"].as_f64().is_some_and(|max| max < SQL_MAX_MS)))
    });
    json!({
        "noop_ratio": section["noop_ratio"].as_f64().map(|r| r >= NOOP_RATIO_MIN),
        "read_p95": all(&|p| reads_ok(p, false)),
        "metrics_p95": all(&|p| reads_ok(p, true)),
        "metrics_under_scrapers_p95": scrape_ok("metrics", METRICS_P95_MS),
        "execution_by_id_under_scrapers_p95": scrape_ok("execution_by_id", READ_P95_MS),
        "sql_max": sql_ok,
        "no_5xx": all(&|p| p["server_errors"].as_u64().map(|n| n == 0)),
    })
}

/// The history section as a table for people: each measurement without and with the history,
/// beside its target.
pub(crate) fn table(section: &Value) -> String {
    let phases = section["phases"].as_array().cloned().unwrap_or_default();
    let phase = |i: usize| phases.get(i).cloned().unwrap_or(Value::Null);
    let (without, with) = (phase(0), phase(1));
    let ok = |good: bool| if good { "ok" } else { "MISSED" }.to_string();
    let cell = |m: &Value, sql: bool| -> String {
        if m.is_null() {
            return "-".into();
        }
        let ms = |key: &str| m[key].as_f64().map_or("-".to_string(), |v| format!("{v:.1}"));
        let mut out = if m["n"].as_u64() == Some(0) {
            "n/a".to_string()
        } else if sql {
            format!("{} / {}", ms("p50_ms"), ms("max_ms"))
        } else {
            format!("{} / {} / {}", ms("p50_ms"), ms("p95_ms"), ms("max_ms"))
        };
        let (server, other) = (m["server_errors"].as_u64().unwrap_or(0), m["other_errors"].as_u64().unwrap_or(0));
        if server > 0 {
            out += &format!(" (5xx: {server})");
        }
        if other > 0 {
            out += &format!(" (failed: {other})");
        }
        out
    };
    // a measurement met its target in every phase that has it, without a failed request
    let verdict = |ms: &[&Value], key: &str, limit: f64, strict: bool| -> String {
        let values: Vec<f64> = ms.iter().filter_map(|m| m[key].as_f64()).collect();
        let failed = ms.iter().any(|m| failures(m) > 0);
        if values.is_empty() {
            return "-".into();
        }
        ok(!failed && values.iter().all(|v| if strict { *v < limit } else { *v <= limit }))
    };
    let mut rows = Vec::new();
    let rate = |p: &Value| p["noop_executions_per_second"].as_f64().map_or("-".to_string(), |v| format!("{v:.1}"));
    rows.push(vec![
        "core.noop at maximum rate (executions/s)".to_string(),
        format!("with / without >= {NOOP_RATIO_MIN}"),
        rate(&without),
        rate(&with),
        section["noop_ratio"].as_f64().map_or("-".to_string(), |r| format!("{r:.3} {}", ok(r >= NOOP_RATIO_MIN))),
    ]);
    let reads = |p: &Value| p["reads"].as_array().cloned().unwrap_or_default();
    let (reads_without, reads_with) = (reads(&without), reads(&with));
    for i in 0..reads_without.len().max(reads_with.len()) {
        let (a, b) = (reads_without.get(i).unwrap_or(&Value::Null), reads_with.get(i).unwrap_or(&Value::Null));
        let name = a["name"].as_str().or(b["name"].as_str()).unwrap_or("").to_string();
        let limit = if name == "GET /metrics" { METRICS_P95_MS } else { READ_P95_MS };
        rows.push(vec![
            name,
            format!("p95 <= {limit} ms"),
            cell(a, false),
            cell(b, false),
            verdict(&[a, b], "p95_ms", limit, false),
        ]);
    }
    for (key, limit) in [("metrics", METRICS_P95_MS), ("execution_by_id", READ_P95_MS)] {
        let (a, b) = (&without["scrape"][key], &with["scrape"][key]);
        rows.push(vec![
            a["name"].as_str().or(b["name"].as_str()).unwrap_or(key).to_string(),
            format!("p95 <= {limit} ms"),
            cell(a, false),
            cell(b, false),
            verdict(&[a, b], "p95_ms", limit, false),
        ]);
    }
    let sql = |p: &Value| p["sql"].as_array().cloned().unwrap_or_default();
    let (sql_without, sql_with) = (sql(&without), sql(&with));
    for i in 0..sql_without.len().max(sql_with.len()) {
        let (a, b) = (sql_without.get(i).unwrap_or(&Value::Null), sql_with.get(i).unwrap_or(&Value::Null));
        rows.push(vec![
            format!("SQL: {} (p50 / max)", a["name"].as_str().or(b["name"].as_str()).unwrap_or("")),
            format!("max < {SQL_MAX_MS} ms"),
            cell(a, true),
            cell(b, true),
            verdict(&[a, b], "max_ms", SQL_MAX_MS, true),
        ]);
    }
    let errors = |p: &Value| p["server_errors"].as_u64().map_or("-".to_string(), |n| n.to_string());
    rows.push(vec![
        "5xx answers".to_string(),
        "none".to_string(),
        errors(&without),
        errors(&with),
        section["verdicts"]["no_5xx"].as_bool().map_or("-".to_string(), ok),
    ]);
    let header = |p: &Value, word: &str| match (p["rows"].as_i64(), p["rows_after"].as_i64()) {
        (Some(n), Some(after)) if after != n => format!("{word} ({} -> {} rows)", thousands(n), thousands(after)),
        (Some(n), _) => format!("{word} ({} rows)", thousands(n)),
        _ => word.to_string(),
    };
    let (h_without, h_with) = (header(&without, "without"), header(&with, "with"));
    let mut out = String::from("history: ");
    let load = &section["load"];
    if load.is_null() {
        out += "nothing loaded";
    } else {
        out += &format!(
            "{} rows loaded in {:.1} s ({} rows/s); execution table {}, indexes {}",
            thousands(load["rows"].as_i64().unwrap_or(0)),
            load["seconds"].as_f64().unwrap_or(0.0),
            thousands(load["rows_per_second"].as_f64().unwrap_or(0.0) as i64),
            bytes(load["table_bytes"].as_i64().unwrap_or(0)),
            bytes(load["index_bytes"].as_i64().unwrap_or(0)),
        );
        match (load["rollup_rebuild_seconds"].as_f64(), load["rollup_rebuild_error"].as_str()) {
            (Some(secs), _) => out += &format!("; execution_rollup_rebuild() {secs:.1} s"),
            (None, Some(error)) => out += &format!("; execution_rollup_rebuild() FAILED: {error}"),
            (None, None) => out += "; no execution_rollup_rebuild()",
        }
    }
    out += &format!(
        "; PostgreSQL autovacuum {}; latencies in ms, p50 / p95 / max\n",
        section["autovacuum"].as_str().unwrap_or("?")
    );
    let headers = ["measurement", "target", h_without.as_str(), h_with.as_str(), "verdict"];
    out += &attune_cli::output::table(&headers, &rows);
    out
}
