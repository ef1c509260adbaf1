//! `attune up`: migrations, pack registration, then api, executor and workers in one process.
//! And `attune migrate`, the migrations alone: the explicit step before services start.

use std::time::Duration;

use anyhow::Context;
use attune_common::db;

/// `attune migrate`: applies what is pending as DATABASE_URL's role and says what it applied.
pub async fn migrate(out: crate::Output) -> anyhow::Result<()> {
    let url: String = attune_common::settings::get("DATABASE_URL")?;
    let pool =
        db::connect(&url, 1, Duration::from_secs(30)).await.context("cannot connect to the database (DATABASE_URL)")?;
    let before = db::applied_migrations(&pool).await?;
    db::migrate(&pool).await.context("applying migrations (DATABASE_URL must be the role that owns the schema)")?;
    let now = db::applied_migrations(&pool).await?;
    let new: Vec<String> = db::MIGRATOR
        .iter()
        .filter(|m| now.contains(&m.version) && !before.contains(&m.version))
        .map(|m| format!("{}_{}", m.version, m.description.replace(' ', "_")))
        .collect();
    match out {
        crate::Output::Json => println!("{}", serde_json::json!({"applied": new, "current": now.last()})),
        crate::Output::Table if new.is_empty() => println!("the schema is current (nothing to apply)"),
        crate::Output::Table => println!("applied {} migration(s):\n  {}", new.len(), new.join("\n  ")),
    }
    Ok(())
}

pub async fn run(workers: u16) -> anyhow::Result<()> {
    let _telemetry = attune_common::telemetry::init("attune");
    let shutdown = attune_common::telemetry::shutdown_on_signal();
    let api = attune_api::Settings::from_env()?;
    let executor = attune_executor::Settings::from_env()?;
    let mut worker = attune_worker::Settings::from_env()?;
    // each action runs under this binary in supervisor mode, so it dies with `attune up`
    worker.supervisor = Some(attune_worker::supervise::OWN_BINARY.into());

    let pool = db::connect(&api.common.database_url, 2, Duration::from_secs(60))
        .await
        .context("cannot connect to the database (DATABASE_URL)")?;
    db::migrate(&pool).await.context("applying migrations")?;
    attune_api::register_packs(&pool, &api.common.packs_dir).await?;
    let startup_time = db::now(&pool).await?;

    let base_name = std::env::var("ATTUNE_WORKER_NAME").unwrap_or_else(|_| "local".into());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn({
        let shutdown = shutdown.clone();
        async move { attune_executor::run(executor, shutdown).await.context("executor") }
    });
    for i in 1..=workers {
        let settings = attune_worker::Settings { name: format!("{base_name}-{i}"), ..worker.clone() };
        let shutdown = shutdown.clone();
        tasks.spawn(async move { attune_worker::run(settings, shutdown).await.context("worker") });
    }
    // The API opens last, once the workers are registered, so the first request finds a worker.
    let names: Vec<String> = (1..=workers).map(|i| format!("{base_name}-{i}")).collect();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(30) && !tasks.is_empty() {
        let registered = db::worker::active_since(&pool, &names, startup_time).await?;
        if registered >= i64::from(workers) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.close().await;
    tasks.spawn({
        let shutdown = shutdown.clone();
        async move { attune_api::run(api, shutdown).await.context("api") }
    });
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
