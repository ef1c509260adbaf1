//! `attune up`: migrations, pack registration, then api, executor and workers in one process.

use std::time::Duration;

use anyhow::Context;
use attune_common::{db, pack};

pub async fn run(workers: u16) -> anyhow::Result<()> {
    attune_common::telemetry::init();
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    let api = attune_api::Settings::from_env()?;
    let executor = attune_executor::Settings::from_env()?;
    let worker = attune_worker::Settings::from_env()?;

    let pool = db::connect(&api.common.database_url, 2, Duration::from_secs(60))
        .await
        .context("cannot connect to the database (DATABASE_URL)")?;
    db::migrate(&pool).await.context("applying migrations")?;
    register_packs(&pool, &api.common.packs_dir).await?;
    pool.close().await;

    let base_name = std::env::var("ATTUNE_WORKER_NAME").unwrap_or_else(|_| "local".into());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn({
        let shutdown = shutdown.clone();
        async move { attune_api::run(api, shutdown).await.context("api") }
    });
    tasks.spawn({
        let shutdown = shutdown.clone();
        async move { attune_executor::run(executor, shutdown).await.context("executor") }
    });
    for i in 1..=workers {
        let settings = attune_worker::Settings { name: format!("{base_name}-{i}"), ..worker.clone() };
        let shutdown = shutdown.clone();
        tasks.spawn(async move { attune_worker::run(settings, shutdown).await.context("worker") });
    }
    // Any service ending on its own is an error: stop the others too.
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        let result = joined.context("service panicked").and_then(|r| r);
        if let Err(e) = result {
            tracing::error!(error = %format!("{e:#}"), "service failed; stopping");
            first_error.get_or_insert(e);
        }
        shutdown.cancel();
    }
    first_error.map_or(Ok(()), Err)
}

/// Registers every pack directory (one with a pack.yaml) under `dir`.
pub async fn register_packs(pool: &sqlx::PgPool, dir: &std::path::Path) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot read packs directory {} (ATTUNE_PACKS_DIR)", dir.display()))?;
    let mut dirs: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("pack.yaml").is_file()).collect();
    dirs.sort();
    for pack_dir in dirs {
        let loaded = pack::load_pack(&pack_dir)?;
        let registered = db::pack::register(pool, &loaded).await?;
        tracing::info!(pack = %registered.pack_ref, actions = registered.action_count, "pack registered");
    }
    Ok(())
}
