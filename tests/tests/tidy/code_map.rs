//! `docs/ARCHITECTURE.md`'s code map names every crate of the workspace, and nothing that is
//! not one: a crate added, moved or removed without its paragraph fails here.

use std::collections::BTreeSet;
use std::path::Path;

fn repo_file(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `members = [...]` of the workspace manifest.
fn workspace_members(manifest: &str) -> BTreeSet<String> {
    let start = manifest.find("members = [").expect("a members list") + "members = [".len();
    let end = start + manifest[start..].find(']').expect("the end of the members list");
    manifest[start..end].split(',').map(|m| m.trim().trim_matches('"').to_string()).filter(|m| !m.is_empty()).collect()
}

/// The crate directories the code map's headings name: `` `dir/` `` in `### ` lines of the
/// "Code map" section.
fn mapped_directories(architecture: &str) -> BTreeSet<String> {
    let section = architecture.split("\n## ").find(|s| s.starts_with("Code map")).expect("a Code map section");
    section
        .lines()
        .filter(|line| line.starts_with("### "))
        .flat_map(|line| line.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>())
        .filter_map(|name| name.strip_suffix('/').map(str::to_string))
        .collect()
}

#[test]
fn the_code_map_names_every_crate() {
    let members = workspace_members(&repo_file("Cargo.toml"));
    let mapped = mapped_directories(&repo_file("docs/ARCHITECTURE.md"));
    let missing: Vec<_> = members.difference(&mapped).collect();
    assert!(missing.is_empty(), "crates without a paragraph in ARCHITECTURE's code map: {missing:?}");
    let non_crates: Vec<_> = mapped
        .iter()
        .filter(|d| !members.contains(*d) && !Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join(d).is_dir())
        .collect();
    assert!(non_crates.is_empty(), "the code map names directories that do not exist: {non_crates:?}");
}

#[test]
fn the_readers_see_what_they_parse() {
    assert_eq!(workspace_members("members = [\"core\", \"api\"]\n"), BTreeSet::from(["core".into(), "api".into()]));
    let doc = "# A\n## Code map\n### `core/` (x)\n### `cli/`, `bench/`\n## Invariants\n### `nope/`\n";
    assert_eq!(mapped_directories(doc), BTreeSet::from(["core".into(), "cli".into(), "bench".into()]));
}
