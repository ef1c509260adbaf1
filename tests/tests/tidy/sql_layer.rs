//! `db` is the only SQL layer: no service, tool or the core crate writes a statement of its own.
//! Tests and examples may read the record directly (as an SRE does); product code may not.

use std::path::{Path, PathBuf};

/// The source trees of the product's code, and the one directory allowed to hold SQL.
const PRODUCT_SOURCES: [&str; 7] =
    ["core/src", "common/src", "api/src", "executor/src", "worker/src", "cli/src", "bench/src"];
const SQL_LAYER: &str = "common/src/db";

/// What SQL written outside `db` looks like: a query builder, or a statement in a string.
const SQL_MARKERS: [&str; 10] = [
    "sqlx::query",
    "query_as(",
    "query_scalar(",
    "raw_sql(",
    "\"SELECT ",
    "\"UPDATE ",
    "\"INSERT INTO",
    "\"DELETE FROM",
    "\"WITH ",
    " FOR UPDATE",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The markers found in `text`, outside comments.
fn sql_in(text: &str) -> Vec<&'static str> {
    let code: String = text.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    SQL_MARKERS.into_iter().filter(|marker| code.contains(marker)).collect()
}

#[test]
fn no_sql_outside_db() {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in PRODUCT_SOURCES {
        rust_files(&root.join(dir), &mut files);
    }
    let sql_layer = root.join(SQL_LAYER);
    let offences: Vec<String> = files
        .iter()
        .filter(|file| !file.starts_with(&sql_layer))
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            let shown = file.strip_prefix(&root).unwrap().display().to_string();
            sql_in(&text).into_iter().map(move |marker| format!("{shown}: {marker}"))
        })
        .collect();
    assert!(offences.is_empty(), "SQL outside `db` (move it into a repository function): {offences:#?}");
    // the search did look: the SQL layer itself is full of statements
    let mut layer = Vec::new();
    rust_files(&sql_layer, &mut layer);
    let statements: usize = layer.iter().map(|f| sql_in(&std::fs::read_to_string(f).unwrap()).len()).sum();
    assert!(statements > 20, "the search found only {statements} markers in db/");
}

#[test]
fn the_search_recognises_sql() {
    assert_eq!(
        sql_in("let n: i64 = sqlx::query_scalar(\"SELECT 1\")"),
        vec!["sqlx::query", "query_scalar(", "\"SELECT "]
    );
    assert_eq!(sql_in("    \"UPDATE worker SET status = 'inactive'\""), vec!["\"UPDATE "]);
    assert!(sql_in("// SELECT * FROM healthy_workers; in a comment").is_empty());
    assert!(sql_in("let text = \"Selected worker\";").is_empty());
}
