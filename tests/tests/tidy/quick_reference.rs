//! The book's quick reference (`book/src/quick-reference.md`) holds every SQL statement of the
//! seed's (`testkit/fixtures/phase3-quickref.txt`) as written; the operators' `seed_sql` test
//! runs each against a real run.

use attune_system_tests::seed::statements;
use attune_testkit::system::repo_root;

/// `text` with every run of white space made one space.
fn squeezed(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_book_holds_every_seed_query_as_written() {
    let seed = std::fs::read_to_string(repo_root().join("testkit/fixtures/phase3-quickref.txt")).unwrap();
    let page = std::fs::read_to_string(repo_root().join("book/src/quick-reference.md")).unwrap();
    let in_page: Vec<String> = statements(&page).iter().map(|s| squeezed(s)).collect();
    let missing: Vec<String> = statements(&seed).iter().map(|s| squeezed(s)).filter(|s| !in_page.contains(s)).collect();
    assert!(missing.is_empty(), "book/src/quick-reference.md lacks: {missing:#?}");
}
