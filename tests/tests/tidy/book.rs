//! The book (`book/src`, built by `make docs`) and the README hold together: every chapter of the
//! summary exists and every file exists in the summary, every `{{#include}}` names a file, every
//! relative link and image reaches a file, and every `#anchor` a heading of the page it names.
//! The README stays a front page (at most 200 lines) that links into the book.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn src() -> PathBuf {
    root().join("book/src")
}

/// A page's text with its `{{#include}}`s read in (the book as mdBook renders it).
fn rendered(page: &Path) -> String {
    let text = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let mut out = String::new();
    for line in text.lines() {
        match line.trim().strip_prefix("{{#include ").and_then(|l| l.strip_suffix("}}")) {
            Some(included) => {
                // `path` or `path:anchor` (the lines between `ANCHOR: anchor` and `ANCHOR_END: anchor`)
                let (file, anchor) = match included.trim().rsplit_once(':') {
                    Some((file, anchor)) if !anchor.contains('/') => (file, Some(anchor)),
                    _ => (included.trim(), None),
                };
                let path = page.parent().unwrap().join(file);
                assert!(path.is_file(), "{} includes {}, which does not exist", page.display(), path.display());
                let text = std::fs::read_to_string(&path).unwrap();
                match anchor {
                    None => out.push_str(&text),
                    Some(anchor) => {
                        let (begin, end) = (format!("ANCHOR: {anchor} "), format!("ANCHOR_END: {anchor} "));
                        let start = text.find(&begin).unwrap_or_else(|| panic!("{}: no {begin}", path.display()));
                        let stop = text.find(&end).unwrap_or_else(|| panic!("{}: no {end}", path.display()));
                        out.push_str(&text[start..stop]);
                    }
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// GitHub's and mdBook's anchor of a heading: lower case, spaces as `-`, punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of `text` outside its code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The anchors of `text`'s headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text).filter(|line| line.starts_with('#')).map(|line| slug(line.trim_start_matches('#'))).collect()
}

/// The targets of `text`'s markdown links and images, outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let outside_spans: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside_spans.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    found
}

fn check_links(page: &Path, text: &str) -> usize {
    let mut checked = 0;
    for target in links(text) {
        if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let file_path = if file.is_empty() { page.to_path_buf() } else { page.parent().unwrap().join(file) };
        assert!(file_path.exists(), "{} links to {target}, which does not exist", page.display());
        if !anchor.is_empty() {
            let of = rendered(&file_path);
            assert!(anchors(&of).contains(anchor), "{} links to {target}: no such heading there", page.display());
        }
        checked += 1;
    }
    checked
}

#[test]
fn the_summary_names_every_chapter_and_every_chapter_is_in_it() {
    let summary = std::fs::read_to_string(src().join("SUMMARY.md")).unwrap();
    let named: BTreeSet<String> = links(&summary).into_iter().collect();
    let files: BTreeSet<String> = std::fs::read_dir(src())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".md") && name != "SUMMARY.md")
        .collect();
    assert_eq!(named, files, "book/src/SUMMARY.md and the chapters in book/src differ");
    for chapter in [
        "getting-started.md",
        "writing-packs.md",
        "using-it.md",
        "retries.md",
        "health-and-scheduling.md",
        "operating.md",
        "security.md",
        "troubleshooting.md",
        "settings.md",
        "architecture.md",
        "adr.md",
    ] {
        assert!(files.contains(chapter), "the book has no {chapter}");
    }
}

#[test]
fn every_link_include_and_anchor_of_the_book_and_the_readme_reaches_its_target() {
    let mut checked = 0;
    for entry in std::fs::read_dir(src()).unwrap() {
        let page = entry.unwrap().path();
        if page.extension().is_some_and(|e| e == "md") {
            checked += check_links(&page, &rendered(&page));
        }
    }
    let readme = root().join("README.md");
    checked += check_links(&readme, &std::fs::read_to_string(&readme).unwrap());
    assert!(checked > 20, "only {checked} links checked");
}

#[test]
fn the_readme_is_a_front_page_of_at_most_200_lines_that_points_into_the_book() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.lines().count() <= 200, "README.md has {} lines", readme.lines().count());
    for must in ["scripts/quickstart.sh", "scripts/test.sh", "make docs", "book/src"] {
        assert!(readme.contains(must), "README.md does not mention {must}");
    }
    // .ci/run runs the README's test command
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(ci.contains("scripts/test.sh"));
}

#[test]
fn a_slug_is_the_heading_s_anchor() {
    assert_eq!(slug(" AttuneRetryRateHigh"), "attuneretryratehigh");
    assert_eq!(slug(" Submitting safely twice: `Idempotency-Key`"), "submitting-safely-twice-idempotency-key");
}
