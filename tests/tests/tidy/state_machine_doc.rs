//! `docs/state-machine.md` draws exactly the edges of `ExecutionStatus::allowed_from`: an edge
//! `from --> to` of its mermaid diagram exists iff `to.allowed_from()` contains `from`. The
//! `[*]` lines (entry and exit markers) are not edges.

use std::collections::HashSet;
use std::path::PathBuf;

use attune_core::ExecutionStatus;

type Edge = (ExecutionStatus, ExecutionStatus);

fn document() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/state-machine.md")
}

/// The edges of the first ```` ```mermaid ```` block of `text`, `[*]` lines left out. An unknown
/// state name, a malformed edge line or a missing block is an error naming what was wrong.
fn edges_in(text: &str) -> Result<HashSet<Edge>, String> {
    let mut lines = text.lines();
    lines.find(|line| line.trim() == "```mermaid").ok_or("no ```mermaid block")?;
    let mut edges = HashSet::new();
    let mut closed = false;
    for line in lines {
        let line = line.trim();
        if line.starts_with("```") {
            closed = true;
            break;
        }
        let Some((from, rest)) = line.split_once("-->") else { continue };
        let to = rest.split_once(':').map_or(rest, |(to, _label)| to);
        let (from, to) = (from.trim(), to.trim());
        if from == "[*]" || to == "[*]" {
            continue;
        }
        let state =
            |name: &str| ExecutionStatus::parse(name).ok_or_else(|| format!("unknown state '{name}' in line: {line}"));
        edges.insert((state(from)?, state(to)?));
    }
    if !closed {
        return Err("the ```mermaid block is not closed".into());
    }
    Ok(edges)
}

/// The edges of the code.
fn code_edges() -> HashSet<Edge> {
    ExecutionStatus::ALL.into_iter().flat_map(|to| to.allowed_from().iter().map(move |from| (*from, to))).collect()
}

/// Edges as `from --> to` lines, in the order of `ExecutionStatus::ALL`.
fn shown(mut edges: Vec<&Edge>) -> Vec<String> {
    let index = |s: ExecutionStatus| ExecutionStatus::ALL.iter().position(|a| *a == s).unwrap();
    edges.sort_by_key(|(from, to)| (index(*from), index(*to)));
    edges.into_iter().map(|(from, to)| format!("{from} --> {to}")).collect()
}

#[test]
fn the_document_draws_exactly_the_edges_of_the_code() {
    let path = document();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let drawn = edges_in(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let code = code_edges();
    let missing = shown(code.difference(&drawn).collect());
    let extra = shown(drawn.difference(&code).collect());
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} disagrees with ExecutionStatus::allowed_from (core/src/status.rs)\n\
         missing from the document: {missing:#?}\n\
         in the document but not in the code: {extra:#?}",
        path.display()
    );
}

#[test]
fn the_parser_finds_what_the_code_lacks() {
    use ExecutionStatus::*;
    let sample = "intro
        ```mermaid
        stateDiagram-v2
            [*] --> requested: API
            requested --> scheduled: executor
            completed --> requested: not an edge of the code
            completed --> [*]
        ```
        running --> completed: outside the block, ignored
    ";
    let drawn = edges_in(sample).unwrap();
    assert_eq!(drawn, HashSet::from([(Requested, Scheduled), (Completed, Requested)]));
    let extra: HashSet<Edge> = drawn.difference(&code_edges()).copied().collect();
    assert_eq!(extra, HashSet::from([(Completed, Requested)]));

    assert!(edges_in("```mermaid\n    requested --> done: x\n```\n").unwrap_err().contains("'done'"));
    assert!(edges_in("no diagram here").is_err());
    assert!(edges_in("```mermaid\n    requested --> scheduled\n").is_err());
}
