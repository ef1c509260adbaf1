//! The operating documents say what attune does (issue 35): the quick reference's "See Also"
//! names exist, and each fact a test can hold is held here. Every setting quoted with its value,
//! "`ATTUNE_X` (N", has that default. The queue names are the topology's. The delivery limit is
//! the code's. Every file named in backticks exists.

use std::path::{Path, PathBuf};
use std::time::Duration;

use attune_common::mq::{DELIVERY_LIMIT, Topology};
use attune_common::settings::{Fallback, setting};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The quick reference's "See Also", and the alerts' runbook.
const DOCS: [&str; 4] = [
    "docs/architecture/worker-availability-handling.md",
    "docs/QUICKREF-worker-availability-phase1.md",
    "docs/QUICKREF-worker-queue-ttl-dlq.md",
    "docs/alerts.md",
];

fn read(doc: &str) -> String {
    std::fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"))
}

#[test]
fn the_see_also_documents_exist_under_the_quick_reference_s_names() {
    let seed = "docs/architecture/worker-availability-handling.md - Phase 1 Guide: \
                docs/QUICKREF-worker-availability-phase1.md - Phase 2 Guide: docs/QUICKREF-worker-queue-ttl-dlq.md";
    for doc in &DOCS[..3] {
        assert!(seed.contains(doc));
        assert!(read(doc).starts_with("# "), "{doc} has a title");
    }
}

#[test]
fn every_setting_quoted_with_a_value_has_that_default() {
    let mut quoted = 0;
    for doc in DOCS {
        let text = read(doc);
        let mut rest = text.as_str();
        while let Some(at) = rest.find("`ATTUNE_") {
            let after = &rest[at + 1..];
            let name: String = after.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
            rest = &after[name.len()..];
            let Some(value) = rest.strip_prefix("` (") else { continue };
            let number: String = value.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            if number.is_empty() {
                continue;
            }
            let default = match setting(&name).default {
                Fallback::Value(value) => value,
                Fallback::Described(what) => panic!("{doc}: {name} ({number}) has no fixed default ({what})"),
            };
            assert_eq!(number, default, "{doc}: {name} is quoted as {number}");
            quoted += 1;
        }
    }
    assert!(quoted >= 15, "only {quoted} settings quoted with their values");
}

#[test]
fn the_queue_names_and_the_delivery_limit_are_the_code_s() {
    let text = read("docs/QUICKREF-worker-queue-ttl-dlq.md");
    let topology = Topology::new("attune", Duration::from_secs(300));
    assert_eq!(
        "attune.worker.<id>.ttl<secs>.q2".replace("<id>", "7").replace("<secs>", "300"),
        topology.worker_queue(7)
    );
    assert!(text.contains("`attune.worker.<id>.ttl<secs>.q2`"));
    for name in [topology.dead_letter_exchange(), topology.dead_letter_queue(), topology.parked_queue()] {
        assert!(text.contains(&format!("`{name}`")), "{name}");
    }
    assert_eq!(topology.worker_queue_expiry(), Duration::from_secs(2 * 300 + 60), "twice the TTL plus a minute");
    assert!(text.contains(&format!("a delivery limit of {DELIVERY_LIMIT}")));
}

#[test]
fn every_file_the_documents_name_exists() {
    let mut named = 0;
    for doc in DOCS {
        let text = read(doc);
        for quoted in text.split('`').skip(1).step_by(2) {
            let looks_like_a_file = ["tests/", "core/", "common/", "executor/", "worker/", "api/", "docs/", "ops/"]
                .iter()
                .any(|dir| quoted.starts_with(dir))
                && (quoted.ends_with(".rs") || quoted.ends_with(".md") || quoted.ends_with(".yml"));
            if looks_like_a_file {
                assert!(root().join(quoted).is_file(), "{doc} names {quoted}, which does not exist");
                named += 1;
            }
        }
    }
    assert!(named > 15, "only {named} files named");
}
