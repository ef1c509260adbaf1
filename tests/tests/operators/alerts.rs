//! The alert rules and the Grafana dashboard (issue 35) with the tools SREs run them with:
//! promtool's own checks and unit tests (`ops/prometheus/attune-alerts.test.yml`: series that
//! cross each threshold and series that stay at it), and a real Prometheus server scraping a
//! running attune and evaluating every rule, one of which goes pending because its condition is
//! true. Every metric the rules and the dashboard name is one attune's `/metrics` declares. (Each
//! alert's summary and runbook section, and the scrape targets, are read by tidy's `alert_rules`.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use attune_testkit::system::repo_root;
use attune_testkit::{System, wait_for};
use serde_json::{Value, json};

/// promtool or prometheus: `target/prometheus` (scripts/test.sh unpacks Debian's package there),
/// else the system's.
fn tool(name: &str) -> PathBuf {
    let unpacked = repo_root().join("target/prometheus/usr/bin").join(name);
    let installed = Path::new("/usr/bin").join(name);
    [unpacked, installed].into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("{name} is missing: scripts/test.sh unpacks it (or run `. scripts/lib.sh; ensure_prometheus`)")
    })
}

fn rules() -> PathBuf {
    repo_root().join("ops/prometheus/attune-alerts.yml")
}

#[test]
fn the_alert_rules_pass_promtool_checks_and_their_unit_tests() {
    for args in [vec!["check", "rules"], vec!["test", "rules"], vec!["check", "config"]] {
        let file = match (args[0], args[1]) {
            ("check", "rules") => rules(),
            ("check", _) => repo_root().join("ops/prometheus/prometheus.yml"),
            _ => repo_root().join("ops/prometheus/attune-alerts.test.yml"),
        };
        let out = Command::new(tool("promtool")).args(&args).arg(&file).output().unwrap();
        let told = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "promtool {args:?} {}:\n{told}", file.display());
    }
}

/// The metric names `text` refers to (`attune_...`), histogram series as their histogram.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("attune_") {
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        let name =
            ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).map(String::from).unwrap_or(n));
        names.insert(name);
    }
    names
}

/// Every `expr` of the rules file and the dashboard.
fn expressions() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(rules()).unwrap()).unwrap();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            found.push((format!("alert {}", rule["alert"].as_str().unwrap()), rule["expr"].as_str().unwrap().into()));
        }
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join("ops/grafana/attune-dashboard.json")).unwrap())
            .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            found.push((format!("panel {}", panel["title"]), target["expr"].as_str().unwrap().into()));
        }
    }
    found
}

async fn get_json(http: &reqwest::Client, url: &str) -> Option<Value> {
    http.get(url).send().await.ok()?.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_attune_and_evaluates_every_rule() {
    // a worker without python: python work waits with nobody to run it
    let system = System::builder().worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "shell,builtin")]).start().await;
    system.submit("core.python_echo", json!({"message": "waits"})).await;

    // every metric the rules and the dashboard name is one attune declares
    let exported = reqwest::get(format!("{}/metrics", system.api_url)).await.unwrap().text().await.unwrap();
    let declared: BTreeSet<String> =
        exported.lines().filter_map(|l| l.strip_prefix("# HELP ")?.split(' ').next().map(String::from)).collect();
    assert!(declared.contains("attune_runtime_workers") && declared.contains("attune_failures_total"), "{declared:?}");
    let expressions = expressions();
    assert!(expressions.len() > 20, "{expressions:?}");
    for (what, expr) in &expressions {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what} names no metric: {expr}");
        for name in names {
            assert!(declared.contains(&name), "{what} names {name}, which attune does not export: {expr}");
        }
    }

    // a Prometheus of its own, scraping the API every second and evaluating the rules as often
    let dir = std::env::temp_dir().join(format!("attune-prometheus-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = system.api_url.trim_start_matches("http://");
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: ['{}']\n\
         scrape_configs:\n  - job_name: attune\n    static_configs: [{{targets: ['{target}']}}]\n",
        rules().display()
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let mut prometheus = Command::new(tool("prometheus"))
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let http = reqwest::Client::new();
    let deadline = Duration::from_secs(60);

    wait_for("Prometheus to scrape attune", deadline, || async {
        let targets = get_json(&http, &format!("{api}/targets")).await?;
        (targets["data"]["activeTargets"][0]["health"] == "up").then_some(())
    })
    .await;
    let rules = wait_for("every rule to be evaluated", deadline, || async {
        let rules = get_json(&http, &format!("{api}/rules")).await?;
        let group = rules["data"]["groups"].as_array()?.iter().find(|g| g["name"] == "attune")?.clone();
        let all = group["rules"].as_array()?;
        all.iter()
            .all(|r| r["health"] == "ok" && r["lastEvaluation"].as_str().is_some_and(|t| !t.starts_with("0001")))
            .then_some(group)
    })
    .await;
    assert_eq!(rules["rules"].as_array().unwrap().len(), 11, "{rules}");
    // python work waits and no worker offers python: the alert's condition holds
    let alert = wait_for("AttuneNoWorkerForRuntime to go pending for python", deadline, || async {
        let alerts = get_json(&http, &format!("{api}/alerts")).await?;
        alerts["data"]["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == "AttuneNoWorkerForRuntime" && a["labels"]["runtime"] == "python")
            .cloned()
    })
    .await;
    assert!(matches!(alert["state"].as_str(), Some("pending" | "firing")), "{alert}");
    // and nothing is said of shell, which w1 runs
    let alerts = get_json(&http, &format!("{api}/alerts")).await.unwrap();
    assert!(
        !alerts["data"]["alerts"].as_array().unwrap().iter().any(|a| a["labels"]["runtime"] == "shell"),
        "{alerts}"
    );

    let _ = prometheus.kill();
    let _ = prometheus.wait();
    system.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The services `ops/prometheus/prometheus.yml` scrapes, as (job, target) pairs.
fn scraped_targets() -> Vec<(String, String)> {
    let config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(repo_root().join("ops/prometheus/prometheus.yml")).unwrap())
            .unwrap();
    let mut targets = Vec::new();
    for job in config["scrape_configs"].as_sequence().unwrap() {
        for static_config in job["static_configs"].as_sequence().unwrap() {
            for target in static_config["targets"].as_sequence().unwrap() {
                targets.push((job["job_name"].as_str().unwrap().into(), target.as_str().unwrap().into()));
            }
        }
    }
    targets
}

/// The metric names that have at least one sample in a Prometheus text page (histogram series as
/// their histogram).
fn sampled_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .flat_map(|line| metric_names(line.split(['{', ' ']).next().unwrap_or("")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_an_alert_or_a_panel_reads_has_samples_from_what_the_quickstart_scrapes() {
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (executor, first, second) = (free(), free(), free());
    let metrics_addr = |port: u16| format!("127.0.0.1:{port}");
    // the quickstart's layout: the executor and each of two workers with an ATTUNE_METRICS_ADDR;
    // these offer no python, so python work waits (the waiting gauges have something to say)
    let runtimes = ("ATTUNE_WORKER_RUNTIMES", "shell,builtin");
    let system = System::builder()
        .env("ATTUNE_METRICS_ADDR", &metrics_addr(executor))
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2")
        .worker("local-1", &[("ATTUNE_METRICS_ADDR", &metrics_addr(first)), runtimes])
        .worker("local-2", &[("ATTUNE_METRICS_ADDR", &metrics_addr(second)), runtimes])
        .pack(repo_root().join("testkit/packs/e2e"))
        // (the quickstart registers every pack of packs/: examples declares a circuit breaker)
        .pack(repo_root().join("packs/examples"))
        .start()
        .await;
    // prometheus.yml's targets, each mapped to the service of this system the quickstart puts there
    let api = system.api_url.trim_start_matches("http://").to_string();
    let ours: std::collections::BTreeMap<&str, String> = [
        ("127.0.0.1:8080", api),
        ("127.0.0.1:9101", metrics_addr(executor)),
        ("127.0.0.1:9102", metrics_addr(first)),
        ("127.0.0.1:9103", metrics_addr(second)),
    ]
    .into();
    let targets = scraped_targets();
    assert_eq!(targets.len(), ours.len(), "{targets:?}");

    // what every rule and panel counts, made to happen once: a failure retried to success (the
    // failure, retry and finished counters, both histograms), a dead letter parked,
    // a schedule's missed occurrences, python work nobody offers to run
    let flaky = system.submit("e2e.flaky", json!({"fail_times": 1})).await;
    assert_eq!(system.wait_chain(flaky["id"].as_i64().unwrap(), Duration::from_secs(60)).await.len(), 2);
    system.publish_raw("execution.request", b"garbage").await;
    let far = (chrono::Utc::now().format("%H").to_string().parse::<u32>().unwrap() + 12) % 24;
    let body = json!({"name": "missed", "action_ref": "core.echo", "parameters": {"message": "m"},
        "cron": format!("0 {far} * * *"), "timezone": "UTC", "catch_up": "skip", "paused": true});
    let (status, made) = system.post("/api/v1/schedules", &body).await;
    assert_eq!(status, 201, "{made}");
    sqlx::query("UPDATE schedule SET paused = false, next_run = next_run - interval '2 days' WHERE name = 'missed'")
        .execute(&system.db.pool)
        .await
        .unwrap();
    system.submit("core.python_echo", json!({"message": "waits"})).await;

    let wanted: BTreeSet<(String, String)> = expressions()
        .into_iter()
        .flat_map(|(what, expr)| metric_names(&expr).into_iter().map(move |n| (n, what.clone())))
        .collect();
    let http = reqwest::Client::new();
    let started = std::time::Instant::now();
    loop {
        let mut served = BTreeSet::new();
        for (job, target) in &targets {
            let address =
                ours.get(target.as_str()).unwrap_or_else(|| panic!("{job} scrapes {target}, not the quickstart's"));
            if let Ok(page) = http.get(format!("http://{address}/metrics")).send().await {
                served.extend(sampled_names(&page.text().await.unwrap_or_default()));
            }
        }
        let missing: Vec<_> = wanted.iter().filter(|(name, _)| !served.contains(name)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "read by a rule or panel, with no sample from any service prometheus.yml scrapes: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    system.stop().await;
}
