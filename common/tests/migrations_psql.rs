//! The quick reference's Phase 3 migration command works as written, any number of times:
//! `psql -f /migrations/20260209000000_phase3_retry_and_health.sql` (docker-compose.yml mounts
//! `migrations/psql/` there) applies Phase 3 to a database that has only the base schema,
//! recording it as sqlx does, and changes nothing on a database that has it.

use std::path::{Path, PathBuf};
use std::process::Command;

use attune_testkit::TestDb;

fn migrations() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").canonicalize().unwrap()
}

/// The seed's command, against `url` (with the sqlx migrations where the compose file puts them
/// named by `-v migrations=`): stdout, and whether it succeeded with nothing on stderr.
fn psql_phase3(url: &str) -> (String, bool) {
    let output = Command::new("psql")
        .arg(url)
        .arg("-v")
        .arg(format!("migrations={}", migrations().display()))
        .arg("-f")
        .arg(migrations().join("psql/20260209000000_phase3_retry_and_health.sql"))
        .output()
        .expect("psql (PostgreSQL's client) must be installed");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("ERROR"), "{stderr}");
    (String::from_utf8_lossy(&output.stdout).into_owned(), output.status.success() && stderr.trim().is_empty())
}

async fn versions(test: &TestDb) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version").fetch_all(&test.pool).await.unwrap()
}

#[tokio::test]
async fn the_phase3_psql_command_applies_phase3_once_and_then_changes_nothing() {
    // a database with the base schema only, as sqlx left it
    let test = TestDb::empty().await;
    let base_only = std::env::temp_dir().join(format!("attune-base-only-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&base_only).unwrap();
    std::fs::copy(
        migrations().join("20260201000000_base_schema.sql"),
        base_only.join("20260201000000_base_schema.sql"),
    )
    .unwrap();
    sqlx::migrate::Migrator::new(base_only.as_path()).await.unwrap().run(&test.pool).await.unwrap();
    assert_eq!(versions(&test).await, [20260201000000]);

    let (said, clean) = psql_phase3(&test.url);
    assert!(clean && said.contains("Phase 3 (migration 20260209000000) applied."), "{said}");
    let view: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('healthy_workers')::text").fetch_one(&test.pool).await.unwrap();
    assert_eq!(view.as_deref(), Some("healthy_workers"));
    assert_eq!(versions(&test).await, [20260201000000, 20260209000000]);

    let (said, clean) = psql_phase3(&test.url);
    assert!(clean && said.contains("already applied: nothing to do"), "{said}");

    // the services start on it: sqlx accepts the recorded Phase 3 and applies the rest
    attune_common::db::migrate(&test.pool).await.expect("the services' migrations after psql's Phase 3");
    let all = versions(&test).await;
    assert_eq!(all.len(), attune_common::db::MIGRATOR.iter().count(), "{all:?}");
    let (said, clean) = psql_phase3(&test.url);
    assert!(clean && said.contains("already applied"), "{said}");
    let _ = std::fs::remove_dir_all(&base_only);
    test.drop_database().await;
}

#[test]
fn the_recorded_checksum_is_the_checksum_sqlx_keeps() {
    let phase3 = attune_common::db::MIGRATOR.iter().find(|m| m.version == 20260209000000).unwrap();
    let hex: String = phase3.checksum.iter().map(|b| format!("{b:02x}")).collect();
    let wrapper =
        std::fs::read_to_string(migrations().join("psql/20260209000000_phase3_retry_and_health.sql")).unwrap();
    assert!(wrapper.contains(&format!("'\\x{hex}'")), "the psql form must record sqlx's checksum {hex}");
}
