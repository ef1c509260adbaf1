//! The benchmark's smoke run (`attune-bench --quick`) against a real system, so it never rots:
//! every workload runs and reports sane numbers.

use std::process::Command;

use attune_testkit::System;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_benchmark_runs_every_workload() {
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (executor, w1, w2) = (port(), port(), port());
    let system = System::builder()
        .env("ATTUNE_METRICS_ADDR", &format!("127.0.0.1:{executor}"))
        .worker("w1", &[("ATTUNE_METRICS_ADDR", &format!("127.0.0.1:{w1}"))])
        .worker("w2", &[("ATTUNE_METRICS_ADDR", &format!("127.0.0.1:{w2}"))])
        .start()
        .await;
    // separate processes: read the broker counters of each
    let metrics: Vec<String> = [format!("{}/metrics", system.api_url)]
        .into_iter()
        .chain([executor, w1, w2].iter().map(|p| format!("http://127.0.0.1:{p}/metrics")))
        .flat_map(|url| ["--metrics-url".to_string(), url])
        .collect();
    let json = std::env::temp_dir().join(format!("attune-bench-{}.json", std::process::id()));
    let plot = std::env::temp_dir().join(format!("attune-bench-{}.svg", std::process::id()));
    let out = Command::new(attune_testkit::workspace_binary("attune-bench"))
        .args(["--quick", "--json", json.to_str().unwrap(), "--plot", plot.to_str().unwrap()])
        .args(&metrics)
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", &system.token)
        .env("DATABASE_URL", &system.db.url)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.starts_with("WORKLOAD") && table.contains("EXEC/S"), "{table}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 11, "noop, rate, echo, echo-rate, python, retry, fleet x2, backlog, load x2: {report:#}");
    let named = |prefix: &str| results.iter().find(|r| r["workload"].as_str().unwrap().starts_with(prefix)).cloned();
    let echo_rate = named("core.echo at ").expect("the echo-rate row");
    assert_eq!(echo_rate["extra"]["offered_rate"], 20.0, "{echo_rate}");
    assert!(named("core.python_echo").is_some(), "the python row: {report:#}");
    let backlog = results.iter().find(|r| r["workload"].as_str().unwrap().starts_with("backlog")).unwrap();
    assert_eq!(backlog["not_completed"], 0, "{backlog}");
    for result in results {
        assert!(result["executions_per_second"].as_f64().unwrap() > 0.0, "{result}");
        assert!(result["latency_ms"]["p99"].as_f64().unwrap() >= result["latency_ms"]["p50"].as_f64().unwrap());
        // commits are shared by batches (so below one per hop), and so are dispatch messages
        // (one per worker per scheduling claim), but both are measured
        assert!(result["db_write_commits_per_execution"].as_f64().unwrap() > 0.0, "{result}");
        assert!(result["broker_round_trips_per_execution"].as_f64().unwrap() > 0.0, "{result}");
        assert_eq!(result["not_completed"], 0, "{result}");
    }
    let retry = results.iter().find(|r| r["workload"].as_str().unwrap().contains("retry")).unwrap();
    assert!(retry["extra"]["retries"].as_i64().unwrap() > 0, "{retry}");
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&plot);
    system.stop().await;
}

/// The `workflow` workload (issue 48) on the `bench` pack: 40 sequential steps of echo and of
/// python (each python run against the spawn floor measured right before it, where the floor is
/// built), and the graph of a fanned-out run, each reported with its numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_workflow_benchmark_reports_per_step_and_graph_times() {
    let bench_pack = attune_testkit::system::repo_root().join("packs/bench");
    let system = System::builder().pack(&bench_pack).worker("w1", &[]).start().await;
    let json = std::env::temp_dir().join(format!("attune-bench-workflow-{}.json", std::process::id()));
    // (the python runs are paired with the spawn floor's where it is built, as `make bench` does)
    let root = attune_testkit::system::repo_root();
    let floor = root.join("../shared/floorbench");
    let floor_built = floor.join("target/release/floorbench").is_file();
    let out = Command::new(attune_testkit::workspace_binary("attune-bench"))
        .args(["--quick", "--workload", "workflow", "--json", json.to_str().unwrap()])
        .current_dir(&root)
        .env("ATTUNE_FLOORBENCH_DIR", &floor)
        .env_remove("ATTUNE_BENCH_NO_FLOOR")
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", &system.token)
        .env("DATABASE_URL", &system.db.url)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{report:#}");
    for result in &results[..2] {
        assert_eq!(result["not_completed"], 0, "{result}");
        assert!(result["extra"]["per_step_ms"].as_f64().unwrap() > 0.0, "{result}");
    }
    if floor_built {
        let ratio = results[1]["extra"]["ratio_to_spawn_floor"].as_f64();
        assert!(ratio.is_some_and(|ratio| ratio > 0.0), "python paired with the spawn floor: {report:#}");
        assert_eq!(results[1]["extra"]["ratios_to_spawn_floor"].as_array().map(Vec::len), Some(2), "{report:#}");
        assert!(results[0]["extra"].get("ratio_to_spawn_floor").is_none(), "{report:#}");
    }
    assert_eq!(results[2]["extra"]["status"], "completed", "{report:#}");
    assert!(results[2]["latency_ms"]["p99"].as_f64().unwrap() > 0.0, "{report:#}");
    let _ = std::fs::remove_file(&json);
    system.stop().await;
}
