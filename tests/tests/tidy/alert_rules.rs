//! The alert rules (`ops/prometheus/attune-alerts.yml`) and what names them: every alert has a
//! summary and a section of its own in the runbook (`docs/alerts.md`), and the quickstart serves
//! each service's metrics where `ops/prometheus/prometheus.yml` scrapes them. (promtool's checks,
//! and a real Prometheus on a running attune, are the operators' `alerts` tests.)

use std::collections::BTreeSet;
use std::path::PathBuf;

use attune_testkit::system::repo_root;

fn rules() -> PathBuf {
    repo_root().join("ops/prometheus/attune-alerts.yml")
}

#[test]
fn every_alert_has_a_summary_and_a_runbook_section() {
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(rules()).unwrap()).unwrap();
    let runbook = std::fs::read_to_string(repo_root().join("docs/alerts.md")).unwrap();
    let mut alerts = 0;
    for rule in rules["groups"][0]["rules"].as_sequence().unwrap() {
        let name = rule["alert"].as_str().unwrap();
        alerts += 1;
        assert!(rule["annotations"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "{name} has no summary");
        let url = rule["annotations"]["runbook_url"].as_str().unwrap();
        assert_eq!(url, format!("docs/alerts.md#{}", name.to_lowercase()), "{name}");
        assert!(runbook.contains(&format!("\n## {name}\n")), "docs/alerts.md has no section {name}");
        assert!(["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap()), "{name}");
    }
    // the quick reference's four, the on-call person's five, missed schedules (issue 46), and
    // raised events nobody answers (issue 49)
    assert_eq!(alerts, 11);
}

/// The metrics ports in `text`: every `91NN` that stands alone.
fn metrics_ports(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|token| token.len() == 4 && token.starts_with("91"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_quickstart_serves_every_service_s_metrics_and_the_scrape_config_names_them() {
    let script = std::fs::read_to_string(repo_root().join("scripts/quickstart.sh")).unwrap();
    let config = std::fs::read_to_string(repo_root().join("ops/prometheus/prometheus.yml")).unwrap();
    // the executor and both workers get an address of their own
    let given = metrics_ports(&script);
    assert_eq!(given, ["9101", "9102", "9103"].map(String::from).into(), "{script}");
    assert_eq!(script.matches("ATTUNE_METRICS_ADDR=").count(), 2, "the executor's, and the workers' loop");
    // and Prometheus scrapes exactly those, the API's too, with the alert rules
    assert_eq!(metrics_ports(&config), given, "{config}");
    assert!(config.contains("127.0.0.1:8080") && config.contains("attune-alerts.yml"), "{config}");
}
