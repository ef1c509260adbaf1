//! The quick reference's `sqlx migrate run` works on a fresh database and leaves the schema the
//! services create: sqlx-cli (installed into `target/sqlx-cli` by `make test`) against one
//! database, the services' own migrator against another, and their schema dumps compared.

use std::process::Command;

use attune_testkit::TestDb;
use attune_testkit::system::repo_root;

/// `pg_dump --schema-only` of a database, without comments and the per-dump `\restrict` key.
fn schema(url: &str) -> String {
    let output = Command::new("pg_dump")
        .args(["--schema-only", "--no-owner", "--no-privileges", url])
        .output()
        .expect("pg_dump (PostgreSQL's client) must be installed");
    assert!(output.status.success(), "pg_dump: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("--") && !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn sqlx_migrate_run_leaves_the_schema_the_services_create() {
    let sqlx = repo_root().join("target/sqlx-cli/bin/sqlx");
    assert!(
        sqlx.is_file(),
        "{} is missing: `make test` installs sqlx-cli there (scripts/lib.sh ensure_sqlx_cli)",
        sqlx.display()
    );
    let by_cli = TestDb::empty().await;
    let output = Command::new(&sqlx)
        .args(["migrate", "run", "--source"])
        .arg(repo_root().join("migrations"))
        .args(["--database-url", &by_cli.url])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "sqlx migrate run: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let applied = String::from_utf8_lossy(&output.stdout);
    assert!(applied.contains("20260209000000/migrate phase3 retry and health"), "{applied}");

    let by_services = TestDb::new().await;
    let (cli, services) = (schema(&by_cli.url), schema(&by_services.url));
    assert!(cli.contains("CREATE VIEW public.healthy_workers"), "{cli}");
    let first_difference = cli.lines().zip(services.lines()).find(|(a, b)| a != b);
    assert_eq!(first_difference, None, "the schema sqlx migrate run leaves differs from the services'");
    assert_eq!(cli.lines().count(), services.lines().count());
    let ledger = |pool: sqlx::PgPool| async move {
        sqlx::query_as::<_, (i64, Vec<u8>)>("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        ledger(by_cli.pool.clone()).await,
        ledger(by_services.pool.clone()).await,
        "the same migrations, the same checksums"
    );
    // and the services start on the database sqlx-cli made: nothing left to apply
    attune_common::db::migrate(&by_cli.pool).await.expect("the services' migrations on it");
    by_cli.drop_database().await;
    by_services.drop_database().await;
}
