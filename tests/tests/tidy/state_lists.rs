//! The lists of execution states written in the schema (the enum, the CHECK constraint, the SQL
//! functions, the partial indexes) are the Rust constants of `ExecutionStatus`, and the failure
//! kinds `execution.failure_kind` may name (the rows of `failure_kind`) are `FailureKind::ALL`,
//! read back from a freshly migrated database; and the Rust side writes no state list into SQL
//! (it binds them).

use std::collections::BTreeSet;
use std::path::Path;

use attune_core::ExecutionStatus::{self, *};
use attune_core::FailureKind;
use attune_testkit::TestDb;

/// The execution states quoted in a piece of SQL.
fn statuses_in(sql: &str) -> BTreeSet<ExecutionStatus> {
    sql.split('\'').skip(1).step_by(2).filter_map(ExecutionStatus::parse).collect()
}

fn set(states: &[ExecutionStatus]) -> BTreeSet<ExecutionStatus> {
    states.iter().copied().collect()
}

#[tokio::test]
async fn the_schema_lists_the_states_the_code_does() {
    let db = TestDb::new().await;
    let pool = &db.pool;

    let labels: Vec<String> = sqlx::query_scalar(
        "SELECT enumlabel::text FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid \
         WHERE t.typname = 'execution_status' ORDER BY e.enumsortorder",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let all: Vec<String> = ExecutionStatus::ALL.iter().map(|s| s.to_string()).collect();
    assert_eq!(labels.iter().collect::<BTreeSet<_>>(), all.iter().collect::<BTreeSet<_>>(), "enum execution_status");

    let check: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'execution_finished_iff_terminal'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(statuses_in(&check), set(&ExecutionStatus::TERMINAL), "{check}");

    // the failure kinds are the rows of `failure_kind`, which `execution.failure_kind` references
    let kinds: Vec<String> = sqlx::query_scalar("SELECT name FROM failure_kind").fetch_all(pool).await.unwrap();
    let kinds: BTreeSet<&str> = kinds.iter().map(String::as_str).collect();
    let known: BTreeSet<&str> = FailureKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(kinds, known, "the rows of failure_kind");
    let reference: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'execution_failure_kind_known'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(reference, "FOREIGN KEY (failure_kind) REFERENCES failure_kind(name)");
    let unknown = sqlx::query(
        "INSERT INTO execution (action_ref, status, failure_kind, finished) VALUES ('x.y', 'failed', 'bored', now())",
    )
    .execute(pool)
    .await
    .unwrap_err();
    assert!(unknown.to_string().contains("execution_failure_kind_known"), "{unknown}");

    for function in ["worker_inflight_counts", "get_worker_queue_depth"] {
        let source: String = sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE proname = $1")
            .bind(function)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(statuses_in(&source), set(&ExecutionStatus::IN_FLIGHT), "{function}: {source}");
    }

    for (index, expected) in [
        ("execution_worker_inflight_idx", set(&ExecutionStatus::IN_FLIGHT)),
        ("execution_waiting_idx", set(&[Requested])),
    ] {
        let predicate: String = sqlx::query_scalar(
            "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE c.relname = $1",
        )
        .bind(index)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(statuses_in(&predicate), expected, "{index}: {predicate}");
    }
    db.drop_database().await;
}

#[test]
fn the_repositories_bind_state_lists() {
    // (every file under db/, a repository split into a directory of its callers' files too)
    let mut files = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../common/src/db")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() { dirs.push(path) } else { files.push(path) }
        }
    }
    assert!(files.len() > 10, "the search found only {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            // a list of two or more states written out, e.g. `status IN ('scheduled', 'running')`
            let quoted = statuses_in(line);
            assert!(
                quoted.len() < 2,
                "{}:{}: a state list written into SQL; bind an `ExecutionStatus` constant instead: {line}",
                file.display(),
                n + 1
            );
        }
    }
}

#[test]
fn the_reader_finds_quoted_states() {
    assert_eq!(
        statuses_in("CHECK ((finished IS NOT NULL) = (status = ANY (ARRAY['completed'::execution_status, 'failed'])))"),
        set(&[Completed, Failed])
    );
    assert!(statuses_in("WHERE status = 'active'").is_empty());
}

/// The dashboard's lists (`api/src/dashboard/dom.js`) are the same constants.
#[test]
fn the_dashboard_lists_the_states_the_code_does() {
    let js =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/src/dashboard/dom.js")).unwrap();
    let array = |name: &str| -> BTreeSet<ExecutionStatus> {
        let start = js.find(&format!("const {name} = [")).unwrap_or_else(|| panic!("dom.js defines {name}"));
        let end = start + js[start..].find(']').unwrap();
        statuses_in(&js[start..end])
    };
    assert_eq!(array("TERMINAL"), set(&ExecutionStatus::TERMINAL), "dom.js TERMINAL");
    assert_eq!(array("STATUSES"), set(&ExecutionStatus::ALL), "dom.js STATUSES");
}
