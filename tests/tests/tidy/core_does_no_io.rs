//! The core crate does no I/O: no database, broker, async runtime, file system, network, process,
//! environment or clock. This test reads the crate's own manifest and sources and fails on the
//! first dependency or API that would let I/O in.

use std::path::{Path, PathBuf};

/// Names that reach the outside world. `sqlx` is allowed only inside `cfg_attr(feature = "sqlx",
/// ...)` (a derive), which `allowed` strips before the search.
const FORBIDDEN_APIS: [&str; 16] = [
    "std::fs",
    "std::net",
    "std::env",
    "std::process",
    "std::io",
    "std::thread",
    "tokio",
    "lapin",
    "sqlx::",
    "reqwest",
    "Utc::now",
    "Local::now",
    "Instant::now",
    "SystemTime",
    "rand::rng(",
    "thread_rng",
];

/// Dependencies the manifest may list (the optional ones only derive traits behind features).
// (regex-lite: parameters' `pattern`, pure computation with no dependencies of its own)
const ALLOWED_DEPENDENCIES: [&str; 7] =
    ["thiserror", "serde", "serde_json", "serde_yaml_ng", "chrono", "rand", "regex-lite"];
const OPTIONAL_ONLY: [&str; 2] = ["sqlx", "utoipa"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../core")
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The text with derive-only uses of optional crates removed, and comments dropped.
fn code_of(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .filter(|line| {
            !line.contains("cfg_attr(feature = \"sqlx\"") && !line.contains("cfg_attr(feature = \"openapi\"")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn forbidden_in(text: &str) -> Vec<&'static str> {
    let code = code_of(text);
    FORBIDDEN_APIS.into_iter().filter(|api| code.contains(api)).collect()
}

/// The one file allowed to name `sqlx`: trait impls for storing the core's enums, compiled only
/// with the `sqlx` feature (checked below).
const STORAGE_IMPLS: &str = "sql.rs";

#[test]
fn core_names_no_io_api() {
    let mut files = Vec::new();
    sources(&crate_dir().join("src"), &mut files);
    let storage = crate_dir().join("src").join(STORAGE_IMPLS);
    let gated = std::fs::read_to_string(&storage).unwrap();
    assert!(gated.contains("#![cfg(feature = \"sqlx\")]"), "{STORAGE_IMPLS} must compile only with the sqlx feature");
    for forbidden in ["query", "PgPool", "Connection", "Executor"] {
        assert!(!gated.contains(forbidden), "{STORAGE_IMPLS} may only say how values are stored: {forbidden}");
    }
    files.retain(|file| *file != storage);
    assert!(files.len() >= 7, "expected the core modules, found {files:?}");
    let offences: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            forbidden_in(&text).into_iter().map(move |api| format!("{}: {api}", file.display()))
        })
        .collect();
    assert!(offences.is_empty(), "attune-core must not do I/O: {offences:#?}");
}

#[test]
fn core_depends_on_nothing_that_does_io() {
    let manifest = std::fs::read_to_string(crate_dir().join("Cargo.toml")).unwrap();
    let mut section = "";
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section != "[dependencies]" || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap();
        let optional = line.contains("optional = true");
        assert!(
            ALLOWED_DEPENDENCIES.contains(&name) || (OPTIONAL_ONLY.contains(&name) && optional),
            "attune-core may not depend on '{name}'"
        );
        assert!(!OPTIONAL_ONLY.contains(&name) || optional, "'{name}' must stay optional (a derive behind a feature)");
    }
}

#[test]
fn the_search_finds_what_it_forbids() {
    // the check itself must be able to fail
    assert_eq!(forbidden_in("fn f() { let _ = std::fs::read(\"x\"); }"), vec!["std::fs"]);
    assert_eq!(forbidden_in("let now = chrono::Utc::now();"), vec!["Utc::now"]);
    assert_eq!(forbidden_in("async fn f(pool: &sqlx::PgPool) {}"), vec!["sqlx::"]);
    assert!(forbidden_in("#[cfg_attr(feature = \"sqlx\", derive(sqlx::Type))]").is_empty());
    assert!(forbidden_in("// tokio is not used here").is_empty());
}
