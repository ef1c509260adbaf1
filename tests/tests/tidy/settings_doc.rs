//! The book's settings table (`book/src/settings.md`) is generated from `attune_common::settings::SETTINGS`; this fails
//! when it is stale. `make settings-doc` (`ATTUNE_BLESS=1` here) writes it afresh.

use std::path::Path;

const BEGIN: &str =
    "<!-- settings table: generated from common/src/settings.rs by `make settings-doc`; do not edit -->\n";
const END: &str = "<!-- end of settings table -->";

#[test]
fn the_book_s_settings_table_is_the_generated_one() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../book/src/settings.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let start = text.find(BEGIN).expect("book/src/settings.md marks its settings table") + BEGIN.len();
    let end = start + text[start..].find(END).expect("the end marker of the settings table");
    let generated = attune_common::settings::markdown_table();
    if std::env::var_os("ATTUNE_BLESS").is_some() {
        std::fs::write(&readme, format!("{}{generated}{}", &text[..start], &text[end..])).unwrap();
        return;
    }
    assert!(
        text[start..end] == generated,
        "book/src/settings.md's settings table differs from common/src/settings.rs: run `make settings-doc`"
    );
}

/// Every environment variable the product's code names is in the table.
#[test]
fn every_variable_the_code_reads_is_in_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut named = std::collections::BTreeSet::new();
    for dir in ["common/src", "api/src", "executor/src", "worker/src", "cli/src", "bench/src"] {
        let mut stack = vec![root.join(dir)];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for quoted in text.split('"').skip(1).step_by(2) {
                    let is_variable = (quoted.starts_with("ATTUNE_") || quoted.ends_with("_URL"))
                        && quoted.len() > 7
                        && quoted.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                    if is_variable {
                        named.insert(quoted.to_string());
                    }
                }
            }
        }
    }
    assert!(named.contains("ATTUNE_WORKER_PREFETCH") && named.contains("DATABASE_URL"), "the search found {named:?}");
    let listed: std::collections::BTreeSet<String> =
        attune_common::settings::SETTINGS.iter().map(|s| s.name.to_string()).collect();
    // what the worker hands to actions (not settings), and the settings table's own test of a
    // name that is not a setting
    let not_settings = [
        "ATTUNE_EXECUTION_ID",
        "ATTUNE_ACTION_REF",
        "ATTUNE_RETRY_COUNT",
        "ATTUNE_IDEMPOTENCY_KEY",
        "ATTUNE_PARAMETERS",
        "ATTUNE_PARAM_MESSAGE",
        "ATTUNE_NOT_A_SETTING",
    ];
    let missing: Vec<_> = named.difference(&listed).filter(|n| !not_settings.contains(&n.as_str())).collect();
    assert!(missing.is_empty(), "variables read but not in common/src/settings.rs: {missing:?}");
}
