//! Human output: tables and key-value blocks. `--output json` bypasses all of this.

use serde_json::Value;

pub fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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

pub fn execution(e: &Value) -> String {
    let mut lines = vec![format!(
        "execution {}  {}  {}",
        text(&e["id"]),
        text(&e["action_ref"]),
        text(&e["status"]).to_uppercase()
    )];
    let fields = [
        "worker",
        "exit_code",
        "failure_kind",
        "error",
        "retry_count",
        "max_retries",
        "retry_reason",
        "original_execution",
        "retried_by",
        "next_attempt_at",
        "created",
        "updated",
    ];
    for field in fields {
        if !e[field].is_null() {
            lines.push(format!("  {field:<18} {}", text(&e[field])));
        }
    }
    lines.push(format!("  {:<18} {}", "parameters", e["parameters"]));
    if !e["result"].is_null() {
        lines.push(format!("  {:<18} {}", "result", e["result"]));
    }
    for stream in ["stdout", "stderr"] {
        if let Some(s) = e[stream].as_str().filter(|s| !s.is_empty()) {
            lines.push(format!("  {stream}:"));
            lines.extend(s.lines().map(|l| format!("    {l}")));
        }
    }
    lines.join("\n")
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
