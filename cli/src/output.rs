//! Human output: tables, the text a field of an answer is shown as, and why an execution was or
//! was not retried. `--output json` bypasses all of this.

use serde::Serialize;
use serde_json::Value;

pub fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A field of an answer as a table shows it: the `text` of its JSON (`-` when null; a time as
/// the API writes it).
pub fn shown(value: &impl Serialize) -> String {
    text(&serde_json::to_value(value).unwrap_or_default())
}

/// `shown`, or `None` when the field is null.
pub fn present(value: &impl Serialize) -> Option<String> {
    let value = serde_json::to_value(value).unwrap_or_default();
    (!value.is_null()).then(|| text(&value))
}

pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_uppercase()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

/// Writes one line to stdout. A reader that went away (`attune execution list | head`) ends the
/// command quietly, as other command-line tools do, rather than with a panic; any other failure
/// to write says so and exits 1.
pub fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(format_args!("{line}\n")).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("attune: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// `println!` for the command line's output: see [`say_line`].
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => { $crate::output::say_line(format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(&["id", "name"], &[vec!["1".into(), "alpha".into()], vec!["200".into(), "b".into()]]);
        assert_eq!(t, "ID   NAME\n1    alpha\n200  b");
    }
}

/// Why an execution (as `GET /api/v1/executions/{id}` shows it) was or was not retried, in
/// words: the decision the RetryManager recorded (`retry_decision`), or what its status says when
/// no decision was made.
pub fn explain(view: &Value) -> String {
    let id = text(&view["id"]);
    let status = view["status"].as_str().unwrap_or("?");
    let kind = text(&view["failure_kind"]);
    let mut lines = vec![format!(
        "execution {id}: {status}{}, attempt {} (retry_count {}, max_retries {})",
        if view["failure_kind"].is_null() { String::new() } else { format!(" ({kind})") },
        view["retry_count"].as_i64().unwrap_or(0) + 1,
        text(&view["retry_count"]),
        if view["max_retries"].as_i64().is_some_and(|m| m < 0) {
            "unlimited".to_string()
        } else {
            text(&view["max_retries"])
        },
    )];
    let decision = &view["retry_decision"];
    if decision.is_object() {
        let verdict = if decision["retried"] == true { "retried" } else { "not retried" };
        lines.push(format!("decision: {verdict} (rule: {})", text(&decision["rule"])));
        lines.push(format!("why: {}", text(&decision["reason"])));
        if let Some(i) = decision["matched_rule"].as_u64() {
            let rule = &decision["policy"]["rules"][i as usize];
            lines.push(format!("matched: retry.rules[{i}]: when {} then {}", rule["when"], rule["then"]));
        }
        if !decision["retry_after"].is_null() {
            lines.push(format!(
                "retry-after: the response asked for no attempt before {}",
                text(&decision["retry_after"])
            ));
        }
        if !decision["held_until"].is_null() {
            lines.push(format!(
                "circuit: the action's circuit held the retry back until {}",
                text(&decision["held_until"])
            ));
        }
        let policy = &decision["policy"];
        let on: Vec<String> = policy["retry_on"].as_array().into_iter().flatten().map(text).collect();
        lines.push(format!(
            "policy: retries {}, {} backoff from {} s (x{}) up to {} s, jitter {}, retried kinds: {}, idempotent: {}{}",
            if policy["enabled"] == true { "enabled" } else { "disabled" },
            text(&policy["backoff"]),
            text(&policy["base_secs"]),
            text(&policy["multiplier"]),
            text(&policy["max_secs"]),
            text(&policy["jitter"]),
            on.join(", "),
            text(&policy["idempotent"]),
            if policy["retryable"] == false { ", retryable: false" } else { "" },
        ));
    } else {
        let why = match (status, kind.as_str()) {
            ("completed", _) => "it completed: there is nothing to retry".to_string(),
            ("canceled", _) => "it was canceled by a client: canceled executions are never retried".to_string(),
            (_, "operator_failed") => "an operator failed it by hand: such executions are never retried".to_string(),
            ("requested" | "scheduled" | "running" | "delayed" | "scheduling", _) => {
                "it has not finished: no retry decision yet".to_string()
            }
            _ => format!(
                "no decision was recorded (it failed before attune recorded them); \
                 SELECT is_execution_retriable({id}) says whether the retry path would retry it now"
            ),
        };
        lines.push(format!("decision: none: {why}"));
    }
    if !view["retried_by"].is_null() {
        lines.push(format!("retried by: execution {}", text(&view["retried_by"])));
    }
    if !view["next_attempt_at"].is_null() {
        lines.push(format!("next attempt at: {}", text(&view["next_attempt_at"])));
    }
    lines.join("\n")
}

#[cfg(test)]
mod explain_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_recorded_decision_is_told_with_its_rule_policy_and_retry() {
        let view = json!({
            "id": 7, "status": "failed", "failure_kind": "transient_error", "retry_count": 0, "max_retries": 3,
            "retried_by": 8, "next_attempt_at": null,
            "retry_decision": {
                "retried": true, "rule": "retried", "reason": "'transient_error' is retried by this action's policy",
                "policy": {"enabled": true, "backoff": "exponential", "base_secs": 1.0, "multiplier": 2.0,
                    "max_secs": 300.0, "jitter": 0.2, "retry_on": ["transient_error"], "idempotent": true}
            }
        });
        let told = explain(&view);
        assert!(
            told.starts_with("execution 7: failed (transient_error), attempt 1 (retry_count 0, max_retries 3)"),
            "{told}"
        );
        assert!(told.contains("decision: retried (rule: retried)"), "{told}");
        assert!(told.contains("retried kinds: transient_error"), "{told}");
        assert!(told.ends_with("retried by: execution 8"), "{told}");
    }

    #[test]
    fn without_a_decision_the_status_says_why() {
        let cases = [
            ("completed", json!(null), "nothing to retry"),
            ("canceled", json!("canceled"), "never retried"),
            ("failed", json!("operator_failed"), "failed it by hand"),
            ("running", json!(null), "has not finished"),
            ("failed", json!("action_failed"), "is_execution_retriable(1)"),
        ];
        for (status, kind, expected) in cases {
            let view = json!({"id": 1, "status": status, "failure_kind": kind, "retry_count": 0, "max_retries": 0});
            assert!(explain(&view).contains(expected), "{status}: {}", explain(&view));
        }
    }

    #[test]
    fn a_decision_by_a_rule_names_the_rule_and_what_held_the_retry() {
        let view = json!({
            "id": 9, "status": "failed", "failure_kind": "transient_error", "retry_count": 1, "max_retries": -1,
            "retried_by": 10, "next_attempt_at": "2026-11-23T12:00:40Z",
            "retry_decision": {
                "retried": true, "rule": "retried", "matched_rule": 0,
                "reason": "retry.rules[0] matched (HTTP status 503), attempt 2 of 10: retry 2 runs after 40.000 s",
                "retry_after": "2026-11-23T12:00:02Z", "held_until": "2026-11-23T12:00:40Z",
                "policy": {"enabled": true, "backoff": "exponential", "base_secs": 1.0, "multiplier": 2.0,
                    "max_secs": 300.0, "jitter": 0.2, "retry_on": ["transient_error"], "idempotent": true,
                    "retryable": true,
                    "rules": [{"when": {"http_status": [503]}, "then": {"do": "retry", "attempts": 10}}]}
            }
        });
        let told = explain(&view);
        assert!(told.contains("max_retries unlimited"), "{told}");
        assert!(
            told.contains(r#"matched: retry.rules[0]: when {"http_status":[503]} then {"attempts":10,"do":"retry"}"#),
            "{told}"
        );
        assert!(told.contains("retry-after: the response asked for no attempt before 2026-11-23T12:00:02Z"), "{told}");
        assert!(
            told.contains("circuit: the action's circuit held the retry back until 2026-11-23T12:00:40Z"),
            "{told}"
        );
    }
}
