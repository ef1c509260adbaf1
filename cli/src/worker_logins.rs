//! `attune worker-login allow | deny | list`: the runtimes each worker's database login may
//! serve (`worker_login_runtime`), through the database as the schema's owner (`DATABASE_URL`).
//! A worker row may advertise, and its login may claim and open the secrets of, only the runs of
//! runtimes its login is granted.

use std::time::Duration;

use anyhow::{Context, bail};
use attune_common::db::worker;
use serde_json::json;

use crate::{Output, WorkerLoginCommand, output};

pub async fn run(command: WorkerLoginCommand, out: Output) -> anyhow::Result<i32> {
    let url: String = attune_common::settings::get("DATABASE_URL")?;
    let pool = attune_common::db::connect(&url, 1, Duration::from_secs(10))
        .await
        .context("cannot connect to the database (DATABASE_URL)")?;
    attune_common::db::check_schema(&pool).await?;
    let changed = match command {
        WorkerLoginCommand::Allow { login, runtimes } => {
            for runtime in &runtimes {
                if runtime.trim().is_empty() || runtime.contains(',') {
                    bail!("runtime {runtime:?}: name one runtime per argument (shell, python, builtin, http)");
                }
            }
            let added = worker::allow_runtimes(&pool, &login, &runtimes).await.map_err(refused)?;
            Some((login, added, "granted"))
        }
        WorkerLoginCommand::Deny { login, runtimes } => {
            let removed = worker::deny_runtimes(&pool, &login, &runtimes).await.map_err(refused)?;
            Some((login, removed, "taken back"))
        }
        WorkerLoginCommand::List => None,
    };
    let grants = worker::runtime_grants(&pool).await?;
    if let Some((login, count, what)) = changed {
        let grant = grants.iter().find(|g| g.login == login);
        if grant.is_some_and(|g| !g.worker_login) {
            eprintln!("note: {login} is not (yet) a login of the attune_worker group: the grant applies once it is");
        }
        match out {
            Output::Json => attune_cli::say!(
                "{}",
                json!({"login": login, "changed": count, "runtimes": grant.map(|g| g.runtimes.clone()).unwrap_or_default()})
            ),
            Output::Table => attune_cli::say!(
                "{login}: {count} {what}; now serves {}",
                grant.map(|g| g.runtimes.join(", ")).filter(|r| !r.is_empty()).unwrap_or_else(|| "no runtime".into())
            ),
        }
        return Ok(0);
    }
    match out {
        Output::Json => attune_cli::say!("{}", serde_json::to_value(&grants)?),
        Output::Table => {
            let rows: Vec<Vec<String>> = grants
                .iter()
                .map(|g| vec![g.login.clone(), g.runtimes.join(","), g.worker_login.to_string()])
                .collect();
            print!("{}", output::table(&["LOGIN", "RUNTIMES", "WORKER_LOGIN"], &rows));
        }
    }
    Ok(0)
}

fn refused(error: sqlx::Error) -> anyhow::Error {
    match &error {
        sqlx::Error::Database(e) if e.code().as_deref() == Some("42501") => {
            anyhow::anyhow!("only the schema's owner changes which runtimes a worker login serves (DATABASE_URL): {e}")
        }
        _ => anyhow::Error::from(error),
    }
}
