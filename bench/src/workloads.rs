//! The workloads of `attune-bench`: how fast attune is, measured through the real API against a running system.
//!
//! Each workload submits executions through `POST /api/v1/executions` and waits until every one
//! has finished (read from the record), then reports completed executions per second, latency
//! from submission to completion (p50, p90, p99, max), and per execution the durable database
//! commits (writing transactions, from the transaction id counter; workers' heartbeats during the
//! run are included) and broker round trips (publishes confirmed plus deliveries settled, from the
//! services' `/metrics`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use attune_common::db;
use serde_json::{Value, json};
use sqlx::PgPool;

/// How many of the oldest unfinished chains one poll of the record reads.
const WAIT_BATCH: usize = 500;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workloads to run (default: all but `history`, and none with `--soak`): noop, rate, echo,
    /// echo-rate (core.echo open loop at `--echo-rate`), python (core.python_echo at maximum
    /// rate, `--count`/16 executions), retry, fleet, backlog, load, history (loads
    /// `--history-rows` finished executions into the database and measures before and after: see
    /// `history`), workflow (never in the default set: 40 sequential steps of core.echo and of
    /// core.python_echo, and the graph of a run of 10,000 steps; the `bench` pack's workflows),
    /// events (never in the default set: webhook deliveries at 200/s with 10 % redelivered for
    /// 5 minutes, at 50/s to running, 1,000 alerts under a cooldown; the `bench` pack's webhook)
    #[arg(long, value_delimiter = ',')]
    pub workload: Vec<String>,
    /// Executions per closed-loop workload
    #[arg(long, default_value_t = 2000)]
    pub count: usize,
    /// Submitting clients for closed-loop workloads
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Offered rate (executions/s) of the `rate` workload (default 200) and of `--soak` (default 300)
    #[arg(long)]
    pub rate: Option<f64>,
    /// Offered rate (executions/s) of the `echo-rate` workload
    #[arg(long, default_value_t = 50.0)]
    pub echo_rate: f64,
    /// Seconds of offered load in the `rate`, `echo-rate` and `load` workloads
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of the same offered load before each `rate` and `load` measurement, not measured
    /// (as the floor's `warm=2`): pools, channels and caches fill under load, not during the
    /// measurement
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Registered (idle) workers added for the `fleet` workload
    #[arg(long, default_value_t = 1000)]
    pub fleet: usize,
    /// A few seconds in all (CI's smoke run)
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON here
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Write an SVG plot of latency against offered load here (needs the `load` workload)
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Metrics endpoints to read broker counters from (default: the API's /metrics)
    #[arg(long)]
    pub metrics_url: Vec<String>,
    /// Draw this curve of the naive floor beside attune's in the plot: a JSON file with
    /// `{"points": [{"offered_rate", "p50", "p99"}, ...]}` (`scripts/bench.sh` writes it)
    #[arg(long)]
    pub floor: Option<std::path::PathBuf>,
    /// A database URL allowed to run `CHECKPOINT` (a superuser, or a member of `pg_checkpoint`):
    /// each workload and each load point then starts right after a checkpoint, as the floor's
    /// runs do (`scripts/bench.sh` passes one when the `postgres` login works)
    #[arg(long)]
    pub admin_url: Option<String>,
    /// Finished executions the `history` workload loads straight into the database (a realistic
    /// mix over the last `--history-days` days) between its two measurements (20,000 at most with
    /// `--quick`; 0: load nothing, measure once)
    #[arg(long, default_value_t = 10_000_000)]
    pub history_rows: u64,
    /// The days the `history` workload's loaded executions are spread evenly over, ending when the
    /// load begins. Kept under the executor's retention of completed executions (7 days by
    /// default, `ATTUNE_RETENTION_COMPLETED`), which would otherwise remove the older history
    /// while it is being measured
    #[arg(long, value_name = "D", default_value_t = 6.0)]
    pub history_days: f64,
    /// Run `core.noop` open loop at `--rate` (default 300/s) for this many minutes, printing every
    /// 30 s the rate completed and the execution table's rows and sizes, and at the end whether
    /// they stayed flat (for attune started with short retention ages, `ATTUNE_RETENTION_*`).
    /// Runs after the workloads named with `--workload` (none by default)
    #[arg(long, value_name = "MINUTES")]
    pub soak: Option<f64>,
    /// Measure nothing: redraw `--plot` from the `load` rows of this earlier `--json` report
    /// (with `--floor`)
    #[arg(long, requires = "plot")]
    pub replot: Option<std::path::PathBuf>,
}

/// One curve of latency against offered load: (offered rate, p50, p99) per point.
struct Curve {
    label: String,
    points: Vec<(f64, f64, f64)>,
    dashed: bool,
}

/// The curves to plot: attune's `load` rows of `report`, and the floor's from `floor` if given.
fn curves(attune: Vec<(f64, f64, f64)>, floor: Option<&std::path::Path>) -> anyhow::Result<Vec<Curve>> {
    let mut curves = vec![Curve { label: "attune".into(), points: attune, dashed: false }];
    if let Some(path) = floor {
        let floor: Value =
            serde_json::from_str(&std::fs::read_to_string(path).with_context(|| path.display().to_string())?)
                .with_context(|| format!("{}: not JSON", path.display()))?;
        let points = floor["points"]
            .as_array()
            .with_context(|| format!("{}: no \"points\" array", path.display()))?
            .iter()
            .map(|p| {
                let field = |name: &str| {
                    p[name].as_f64().with_context(|| format!("{}: a point without \"{name}\"", path.display()))
                };
                Ok((field("offered_rate")?, field("p50")?, field("p99")?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        curves.push(Curve { label: "naive floor".into(), points, dashed: true });
    }
    Ok(curves)
}

/// Redraws the plot of an earlier report's `load` rows (`--replot`), with the floor's curve.
pub fn replot(args: &BenchArgs) -> anyhow::Result<()> {
    let (Some(report), Some(out)) = (&args.replot, &args.plot) else { bail!("--replot needs --plot") };
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(report).with_context(|| report.display().to_string())?)?;
    let attune: Vec<(f64, f64, f64)> = report["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["workload"].as_str().is_some_and(|w| w.starts_with("load ")))
        .filter_map(|r| {
            Some((
                r["extra"]["offered_rate"].as_f64()?,
                r["latency_ms"]["p50"].as_f64()?,
                r["latency_ms"]["p99"].as_f64()?,
            ))
        })
        .collect();
    if attune.is_empty() {
        bail!("the report has no `load` rows to plot");
    }
    std::fs::write(out, plot(&curves(attune, args.floor.as_deref())?))?;
    Ok(())
}

pub(crate) struct Bench {
    pub(crate) http: reqwest::Client,
    pub(crate) api: String,
    pub(crate) token: String,
    pub(crate) db: PgPool,
    metrics_urls: Vec<String>,
    /// Transaction ids this benchmark took itself (subtracted from the commit count).
    own_statements: std::sync::atomic::AtomicU64,
    /// A connection allowed to `CHECKPOINT` (`--admin-url`): each workload and each load point
    /// then starts right after a checkpoint, as the floor's runs do.
    admin: Option<PgPool>,
}

#[derive(Debug, Clone)]
pub(crate) struct Measured {
    name: String,
    pub(crate) executions: usize,
    pub(crate) elapsed: f64,
    latencies_ms: Vec<f64>,
    commits: f64,
    broker: f64,
    /// Executions (chains) that ended other than `completed`.
    not_completed: usize,
    extra: Value,
}

impl Measured {
    /// A measurement made outside the loops here (`crate::workflows`).
    pub(crate) fn new(
        name: &str,
        executions: usize,
        elapsed: f64,
        latencies_ms: Vec<f64>,
        not_completed: usize,
        extra: Value,
    ) -> Measured {
        Measured {
            name: name.to_string(),
            executions,
            elapsed,
            latencies_ms,
            commits: 0.0,
            broker: 0.0,
            not_completed,
            extra,
        }
    }

    fn percentile(&self, p: f64) -> f64 {
        let mut sorted = self.latencies_ms.clone();
        sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if sorted.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    fn to_json(&self) -> Value {
        let round = |v: f64| (v * 100.0).round() / 100.0;
        json!({
            "workload": self.name,
            "executions": self.executions,
            "seconds": round(self.elapsed),
            "executions_per_second": round(self.executions as f64 / self.elapsed),
            "latency_ms": {"p50": round(self.percentile(50.0)), "p90": round(self.percentile(90.0)),
                           "p99": round(self.percentile(99.0)), "max": round(self.percentile(100.0))},
            "db_write_commits_per_execution": round(self.commits),
            "broker_round_trips_per_execution": round(self.broker),
            "not_completed": self.not_completed,
            "extra": self.extra,
        })
    }
}

fn epoch_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

impl Bench {
    /// A checkpoint now, when the benchmark may run one (`--admin-url`).
    async fn checkpoint(&self) -> anyhow::Result<()> {
        if let Some(admin) = &self.admin {
            db::bench::checkpoint(admin).await.context("CHECKPOINT (--admin-url)")?;
        }
        Ok(())
    }

    /// The database's transaction id counter: it advances once per writing transaction (the
    /// commits that must reach the WAL), immediately, unlike pg_stat's delayed counters. Reading it
    /// takes one id itself, counted in `own_statements`.
    async fn commits(&self) -> anyhow::Result<f64> {
        self.own_statements.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let xid = db::bench::transaction_counter(&self.db).await?;
        Ok(xid as f64)
    }

    async fn broker(&self) -> f64 {
        let mut total = 0.0;
        for url in &self.metrics_urls {
            if let Ok(response) = self.http.get(url).send().await
                && let Ok(text) = response.text().await
            {
                for line in text.lines() {
                    if line.starts_with("attune_broker_publishes_total")
                        || line.starts_with("attune_broker_deliveries_total")
                    {
                        total += line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                    }
                }
            }
        }
        total
    }

    pub(crate) async fn submit(&self, action_ref: &str, parameters: &Value) -> anyhow::Result<(i64, f64)> {
        let submitted = epoch_now();
        let response = self
            .http
            .post(format!("{}/api/v1/executions", self.api))
            .bearer_auth(&self.token)
            .json(&json!({"action_ref": action_ref, "parameters": parameters}))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await?;
        if status.as_u16() != 201 {
            bail!("submit {action_ref}: {status} {body}");
        }
        Ok((body["id"].as_i64().context("no id")?, submitted))
    }

    /// Waits until every chain rooted at `roots` has ended; returns the submission and end time of
    /// each chain, and how many chains did not end `completed`.
    async fn wait(&self, roots: &[(i64, f64)], deadline: Duration) -> anyhow::Result<(Vec<(f64, f64)>, usize)> {
        let started = Instant::now();
        // the attempt each unfinished chain is at, and the chain's root
        let mut pending: BTreeMap<i64, i64> = roots.iter().map(|r| (r.0, r.0)).collect();
        let mut ends = HashMap::new();
        let mut not_completed = 0;
        while !pending.is_empty() {
            if started.elapsed() > deadline {
                bail!("{} executions had not finished after {deadline:?}", pending.len());
            }
            // The oldest pending attempts only, each read by its id: executions finish roughly
            // in submission order, and a read of every pending chain (thousands while a backlog
            // drains) cost the database more than some of what is being measured. A batch that
            // all moved on is followed at once by the next.
            let ids: Vec<i64> = pending.keys().take(WAIT_BATCH).copied().collect();
            let rows = db::bench::attempts(&self.db, &ids).await?;
            let mut moved = 0;
            for (id, finished, completed, retried_by) in rows {
                match (retried_by, finished) {
                    // retried: the chain goes on with the next attempt
                    (Some(next), _) => {
                        let root = pending.remove(&id).context("attempt polled twice")?;
                        pending.insert(next, root);
                    }
                    (None, Some(finished)) => {
                        let root = pending.remove(&id).context("attempt polled twice")?;
                        not_completed += usize::from(!completed);
                        ends.insert(root, finished);
                    }
                    (None, None) => continue,
                }
                moved += 1;
            }
            if moved < ids.len() {
                // completion times come from the record, so polling less often costs no accuracy
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok((roots.iter().map(|(id, submitted)| (*submitted, ends[id])).collect(), not_completed))
    }

    /// Closed loop: `count` submissions by `concurrency` clients, as fast as they go.
    pub(crate) async fn closed_loop(
        self: &Arc<Self>,
        name: &str,
        count: usize,
        concurrency: usize,
        mix: &[(f64, &str, Value)],
    ) -> anyhow::Result<Measured> {
        self.checkpoint().await?;
        let (commits_before, broker_before) = (self.commits().await?, self.broker().await);
        let own_before = self.own_statements.load(std::sync::atomic::Ordering::Relaxed);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut clients = tokio::task::JoinSet::new();
        // a deterministic mix: execution i takes the kind whose share covers (i mod 100) / 100
        let plan: Arc<Vec<(String, Value)>> = Arc::new(
            (0..count)
                .map(|i| {
                    let slot = (i % 100) as f64 / 100.0;
                    let mut covered = 0.0;
                    let (_, action, params) = mix
                        .iter()
                        .find(|(share, _, _)| {
                            covered += share;
                            slot < covered - 1e-9
                        })
                        .unwrap_or(&mix[mix.len() - 1]);
                    (action.to_string(), params.clone())
                })
                .collect(),
        );
        let started = epoch_now();
        for _ in 0..concurrency.min(count) {
            let (bench, next, plan) = (self.clone(), next.clone(), plan.clone());
            clients.spawn(async move {
                let mut submitted = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= plan.len() {
                        return anyhow::Ok(submitted);
                    }
                    submitted.push(bench.submit(&plan[i].0, &plan[i].1).await?);
                }
            });
        }
        let mut roots = Vec::new();
        while let Some(joined) = clients.join_next().await {
            roots.extend(joined??);
        }
        self.finish(name, started, &roots, commits_before, broker_before, own_before).await
    }

    async fn finish(
        &self,
        name: &str,
        started: f64,
        roots: &[(i64, f64)],
        commits_before: f64,
        broker_before: f64,
        own_before: u64,
    ) -> anyhow::Result<Measured> {
        let (times, not_completed) = self.wait(roots, Duration::from_secs(600)).await?;
        let last = times.iter().map(|t| t.1).fold(started, f64::max);
        let own = (self.own_statements.load(std::sync::atomic::Ordering::Relaxed) - own_before) as f64;
        let commits = self.commits().await? - commits_before - own;
        let broker = self.broker().await - broker_before;
        let n = roots.len() as f64;
        Ok(Measured {
            name: name.to_string(),
            executions: roots.len(),
            elapsed: last - started,
            latencies_ms: times.iter().map(|(s, f)| (f - s) * 1000.0).collect(),
            commits: commits / n,
            broker: broker / n,
            not_completed,
            extra: json!({}),
        })
    }

    /// Open loop: submissions of `action` at a fixed offered rate for `warmup` seconds (not
    /// measured), then for `duration` seconds (measured) without a break.
    async fn open_loop(
        self: &Arc<Self>,
        name: &str,
        (action, parameters): (&str, &Value),
        rate: f64,
        warmup: f64,
        duration: f64,
    ) -> anyhow::Result<Measured> {
        let interval = Duration::from_secs_f64(1.0 / rate);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let submit = |tasks: &mut tokio::task::JoinSet<anyhow::Result<(i64, f64)>>| {
            let (bench, action, parameters) = (self.clone(), action.to_string(), parameters.clone());
            tasks.spawn(async move { bench.submit(&action, &parameters).await });
        };
        self.checkpoint().await?;
        let mut warming = tokio::task::JoinSet::new();
        for _ in 0..(rate * warmup).round() as usize {
            ticker.tick().await;
            submit(&mut warming);
        }
        let (commits_before, broker_before) = (self.commits().await?, self.broker().await);
        let own_before = self.own_statements.load(std::sync::atomic::Ordering::Relaxed);
        let total = (rate * duration).round().max(1.0) as usize;
        let started = epoch_now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..total {
            ticker.tick().await;
            submit(&mut tasks);
        }
        let mut roots = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            roots.push(joined??);
        }
        while let Some(joined) = warming.join_next().await {
            joined??;
        }
        let mut measured = self.finish(name, started, &roots, commits_before, broker_before, own_before).await?;
        measured.extra = json!({"offered_rate": rate});
        Ok(measured)
    }
}

pub async fn run(api: &str, token: Option<String>, args: BenchArgs) -> anyhow::Result<Value> {
    let token = token.context("attune-bench needs a token (ATTUNE_TOKEN or --token)")?;
    let url: String = attune_common::settings::get("DATABASE_URL")?;
    let db = attune_common::db::connect(&url, 2, Duration::from_secs(10)).await.context("DATABASE_URL")?;
    let admin = match &args.admin_url {
        Some(url) => Some(attune_common::db::connect(url, 1, Duration::from_secs(10)).await.context("--admin-url")?),
        None => None,
    };
    let metrics_urls =
        if args.metrics_url.is_empty() { vec![format!("{api}/metrics")] } else { args.metrics_url.clone() };
    let bench = Arc::new(Bench {
        http: reqwest::Client::new(),
        api: api.trim_end_matches('/').to_string(),
        token,
        db,
        metrics_urls,
        own_statements: Default::default(),
        admin,
    });
    let all = ["noop", "rate", "echo", "echo-rate", "python", "retry", "fleet", "backlog", "load"];
    let chosen: Vec<String> = match (args.workload.is_empty(), args.soak.is_some()) {
        (false, _) => args.workload.clone(),
        (true, false) => all.iter().map(|s| s.to_string()).collect(),
        (true, true) => Vec::new(),
    };
    let q = args.quick;
    let count = if q { 100 } else { args.count };
    let (rate_duration, fleet) = if q { (2.0, 100) } else { (args.duration, args.fleet) };
    let warmup = if q { 0.5 } else { args.warmup };
    let mut results = Vec::new();
    let mut history = None;
    for workload in &chosen {
        eprintln!("running {workload} ...");
        let measured = match workload.as_str() {
            "noop" => vec![
                bench
                    .closed_loop("core.noop, max rate", count, args.concurrency, &[(1.0, "core.noop", json!({}))])
                    .await?,
            ],
            "rate" => {
                let rate = if q { 50.0 } else { args.rate.unwrap_or(200.0) };
                let noop = ("core.noop", &json!({}));
                vec![
                    bench
                        .open_loop(&format!("core.noop at {rate}/s offered"), noop, rate, warmup, rate_duration)
                        .await?,
                ]
            }
            // a shell action at a modest rate: its latency, not the most the machine runs
            "echo-rate" => {
                let rate = if q { 20.0 } else { args.echo_rate };
                let echo = ("core.echo", &json!({"message": "bench"}));
                vec![
                    bench
                        .open_loop(&format!("core.echo at {rate}/s offered"), echo, rate, warmup, rate_duration)
                        .await?,
                ]
            }
            "echo" => vec![
                bench
                    .closed_loop(
                        "core.echo (shell), max rate",
                        count / 4,
                        args.concurrency,
                        &[(1.0, "core.echo", json!({"message": "bench"}))],
                    )
                    .await?,
            ],
            // python's own start-up is most of a run: the platform should add almost nothing
            "python" => vec![
                bench
                    .closed_loop(
                        "core.python_echo, max rate",
                        if q { 20 } else { count / 16 },
                        args.concurrency,
                        &[(1.0, "core.python_echo", json!({"message": "bench"}))],
                    )
                    .await?,
            ],
            "retry" => vec![retry_mix(&bench, if q { 20 } else { count / 4 }, args.concurrency).await?],
            "fleet" => fleet_workload(&bench, fleet, if q { 100 } else { count / 2 }, args.concurrency).await?,
            "backlog" => vec![backlog(&bench, if q { 16 } else { 200 }, args.concurrency).await?],
            "load" => {
                let rates: Vec<f64> =
                    if q { vec![25.0, 50.0] } else { vec![50.0, 100.0, 200.0, 400.0, 500.0, 600.0, 800.0] };
                let mut points = Vec::new();
                for rate in rates {
                    points.push(
                        bench
                            .open_loop(
                                &format!("load {rate}/s"),
                                ("core.noop", &json!({})),
                                rate,
                                warmup,
                                if q { 1.0 } else { 5.0 },
                            )
                            .await?,
                    );
                }
                if let Some(path) = &args.plot {
                    let attune = points
                        .iter()
                        .map(|m| {
                            (m.extra["offered_rate"].as_f64().unwrap_or(0.0), m.percentile(50.0), m.percentile(99.0))
                        })
                        .collect();
                    std::fs::write(path, plot(&curves(attune, args.floor.as_deref())?))?;
                }
                points
            }
            "workflow" => crate::workflows::run(&bench, q, 10_000).await?,
            "events" => crate::events::run(&bench, q).await?,
            "history" => {
                let (measured, section) = crate::history::run(&bench, &args).await?;
                history = Some(section);
                measured
            }
            other => {
                bail!("unknown workload '{other}' (expected one of: {}, history, workflow, events)", all.join(", "))
            }
        };
        results.extend(measured);
    }
    let soak = match args.soak {
        Some(minutes) => {
            eprintln!("running the soak ...");
            Some(crate::soak::run(&bench, minutes, args.rate.unwrap_or(300.0)).await?)
        }
        None => None,
    };
    let rows: Vec<Value> = results.iter().map(Measured::to_json).collect();
    let mut report = json!({
        "machine": machine(),
        "results": rows,
    });
    // (sections of their own, only when they ran: the rows above keep their format)
    if let Some(history) = history {
        report["history"] = history;
    }
    if let Some(soak) = soak {
        report["soak"] = soak;
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(report)
}

/// 30 % of executions fail transiently once and succeed on their retry.
async fn retry_mix(bench: &Arc<Bench>, count: usize, concurrency: usize) -> anyhow::Result<Measured> {
    let since = db::now(&bench.db).await?;
    let mix = [(0.3, "core.flaky", json!({"fail_times": 1})), (0.7, "core.noop", json!({}))];
    let mut measured = bench.closed_loop("30 % fail once then retry", count, concurrency, &mix).await?;
    let gaps = db::bench::retry_delays(&bench.db, since).await?;
    let late: Vec<f64> = gaps.iter().map(|(backoff, gap)| (gap - backoff) * 1000.0).collect();
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    measured.extra = json!({
        "retries": gaps.len(),
        "mean_backoff_ms": (mean(&gaps.iter().map(|g| g.0 * 1000.0).collect::<Vec<_>>()) * 10.0).round() / 10.0,
        "mean_gap_over_backoff_ms": (mean(&late) * 10.0).round() / 10.0,
        "max_gap_over_backoff_ms": (late.iter().cloned().fold(0.0, f64::max) * 10.0).round() / 10.0,
    });
    Ok(measured)
}

/// A backlog far longer than the worker queues' TTL (`make bench` runs the workers with
/// concurrency 4 and a 30 s queue TTL): `count` actions of 1 s submitted at once. Every one must
/// complete, and the whole must take about `count` × 1 s / the run slots of the workers that offer
/// the shell runtime: capacity, not the TTL, decides when each runs.
async fn backlog(bench: &Arc<Bench>, count: usize, concurrency: usize) -> anyhow::Result<Measured> {
    let run_slots = db::bench::run_slots(&bench.db, "shell").await?;
    if run_slots == 0 {
        bail!("the backlog workload needs an active worker offering the shell runtime");
    }
    let sleep = [(1.0, "core.sleep", json!({"seconds": 1}))];
    let name = format!("backlog: {count} × 1 s on {run_slots} run slots");
    let mut measured = bench.closed_loop(&name, count, concurrency, &sleep).await?;
    let ideal = count as f64 / run_slots as f64;
    measured.extra = json!({
        "run_slots": run_slots,
        "ideal_secs": ideal,
        "makespan_secs": (measured.elapsed * 100.0).round() / 100.0,
        "makespan_over_ideal": (measured.elapsed / ideal * 1000.0).round() / 1000.0,
    });
    Ok(measured)
}

/// Scheduling with few and with many registered workers: idle workers that heartbeat, offer the
/// workload's runtime and report a full queue (unhealthy by queue depth), so the scheduler must
/// weigh them all (once per in-flight read, when it builds its shortlist) and never chooses one.
async fn fleet_workload(
    bench: &Arc<Bench>,
    fleet: usize,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Vec<Measured>> {
    let noop = [(1.0, "core.noop", json!({}))];
    let few = bench.closed_loop("scheduling with the real workers only", count, concurrency, &noop).await?;
    db::bench::register_idle_fleet(&bench.db, fleet as i64).await?;
    let keep_fresh = {
        let db = bench.db.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let _ = db::bench::heartbeat_idle_fleet(&db).await;
            }
        })
    };
    let many =
        bench.closed_loop(&format!("scheduling with {fleet} more registered workers"), count, concurrency, &noop).await;
    keep_fresh.abort();
    db::bench::remove_idle_fleet(&bench.db).await?;
    Ok(vec![few, many?])
}

fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<f64>().unwrap_or(0.0) / 1048576.0)
        })
        .unwrap_or(0.0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    json!({"cpus": cpus, "memory_gib": (memory * 10.0).round() / 10.0, "cpu_model": model})
}

/// Latency (p50 and p99) against offered load, as a small SVG: a solid line per percentile for
/// attune, dashed for the floor.
fn plot(curves: &[Curve]) -> String {
    let (w, h, left, bottom) = (640.0, 360.0, 60.0, 40.0);
    let all = || curves.iter().flat_map(|c| c.points.iter());
    let mut rates: Vec<f64> = all().map(|p| p.0).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let max_rate = rates.iter().cloned().fold(1.0, f64::max);
    // latency on a log scale from 1 ms to the next power of ten above the highest p99, so the
    // milliseconds below saturation and the seconds past it both show
    let decades = all().map(|p| p.2).fold(10.0, f64::max).log10().ceil();
    let x = |r: f64| left + (w - left - 20.0) * r / max_rate;
    let y = |l: f64| h - bottom - (h - bottom - 20.0) * l.max(1.0).log10() / decades;
    let line = |curve: &Curve, p99: bool, colour: &str| {
        let coords: Vec<String> =
            curve.points.iter().map(|p| format!("{:.1},{:.1}", x(p.0), y(if p99 { p.2 } else { p.1 }))).collect();
        let dash = if curve.dashed { " stroke-dasharray=\"6 4\"" } else { "" };
        format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
            coords.join(" ")
        )
    };
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    svg += &format!("<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    svg += &format!(
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
        h - bottom,
        w - 20.0,
        h - bottom
    );
    svg += &format!("<line x1=\"{left}\" y1=\"20\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>", h - bottom);
    for r in &rates {
        svg += &format!("<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{r}</text>", x(*r), h - bottom + 16.0);
    }
    for i in 0..=decades as i32 {
        let l = 10f64.powi(i);
        svg += &format!("<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{l:.0}</text>", left - 6.0, y(l) + 4.0);
    }
    svg += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">offered load (executions/s)</text>",
        (w + left) / 2.0,
        h - 6.0
    );
    svg += &format!(
        "<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">latency, submission to completion (ms, log scale)</text>",
        h / 2.0,
        h / 2.0
    );
    let mut legend_y = 34.0;
    for curve in curves {
        svg += &line(curve, false, "#1f77b4");
        svg += &line(curve, true, "#d62728");
        let style = if curve.dashed { "dashed" } else { "solid" };
        svg += &format!(
            "<text x=\"{}\" y=\"{legend_y}\">{} ({style}): <tspan fill=\"#1f77b4\">p50</tspan>, <tspan fill=\"#d62728\">p99</tspan></text>",
            left + 10.0,
            curve.label
        );
        legend_y += 16.0;
    }
    svg += "</svg>\n";
    svg
}

/// The table printed for people.
pub fn table(report: &Value) -> String {
    let rows: Vec<Vec<String>> = report["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            vec![
                r["workload"].as_str().unwrap_or("").to_string(),
                r["executions"].to_string(),
                format!("{:.1}", r["executions_per_second"].as_f64().unwrap_or(0.0)),
                format!("{:.1}", r["latency_ms"]["p50"].as_f64().unwrap_or(0.0)),
                format!("{:.1}", r["latency_ms"]["p90"].as_f64().unwrap_or(0.0)),
                format!("{:.1}", r["latency_ms"]["p99"].as_f64().unwrap_or(0.0)),
                format!("{:.1}", r["latency_ms"]["max"].as_f64().unwrap_or(0.0)),
                format!("{:.1}", r["db_write_commits_per_execution"].as_f64().unwrap_or(0.0)),
                format!("{:.1}", r["broker_round_trips_per_execution"].as_f64().unwrap_or(0.0)),
                r["not_completed"].to_string(),
            ]
        })
        .collect();
    let headers =
        ["workload", "n", "exec/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "commits/exec", "broker/exec", "failed"];
    let mut out = String::new();
    // (a soak alone has no rows)
    if !rows.is_empty() || (report.get("history").is_none() && report.get("soak").is_none()) {
        out += &attune_cli::output::table(&headers, &rows);
    }
    if let Some(history) = report.get("history") {
        out += &format!("\n{}", crate::history::table(history));
    }
    if let Some(soak) = report.get("soak") {
        out += &format!("\n{}", crate::soak::table(soak));
    }
    out
}
