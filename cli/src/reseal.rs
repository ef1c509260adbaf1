//! `attune secret reseal`: the step of a key rotation that seals everything again with the key in
//! force (`ATTUNE_SECRETS_KEY_FILE`), opening it with that key or a previous one
//! (`ATTUNE_SECRETS_PREVIOUS_KEY_FILES`): the stored secrets, and the sealed parameters of every
//! schedule (each of its runs is given them) and every execution (a retry of a finished one runs
//! with them again). Through the database as the
//! schema's owner (`DATABASE_URL`). A value changed meanwhile (a secret set again, sealed with the
//! key in force already) is left as it is; a value no key opens is named and counted, and makes
//! the command fail: the previous keys must stay until it is dealt with.

use std::time::Duration;

use anyhow::{Context, bail};
use attune_common::db::secret;
use attune_common::secrets::Sealer;
use serde_json::{Value, json};

use crate::Output;

/// Executions read per batch.
const BATCH: i64 = 500;

#[derive(Debug, Default, serde::Serialize)]
struct Resealed {
    secrets: u64,
    /// sealed parameters of executions
    parameters: u64,
    /// sealed parameters of schedules
    schedule_parameters: u64,
    /// already sealed with the key in force
    current: u64,
    /// what no key opens: `secret:<name>`, `execution:<id>.<parameter>`
    unopenable: Vec<String>,
}

pub async fn run(out: Output, reason: Option<&str>) -> anyhow::Result<i32> {
    let Some(sealer) = Sealer::from_source(&attune_common::config::Environment)? else {
        bail!("set {}: the key to seal with", attune_common::secrets::KEY_FILE);
    };
    let url: String = attune_common::settings::get("DATABASE_URL")?;
    let pool = attune_common::db::connect(&url, 1, Duration::from_secs(10))
        .await
        .context("cannot connect to the database (DATABASE_URL)")?;
    attune_common::db::check_schema(&pool).await?;
    let mut done = Resealed::default();
    for (name, sealed) in secret::all_sealed(&pool).await? {
        if sealer.sealed_with_current(&name, &sealed) {
            done.current += 1;
            continue;
        }
        match sealer.open(&name, &sealed) {
            Ok(plain) => {
                if secret::reseal(&pool, &name, &sealed, &sealer.seal(&name, &plain)).await? {
                    done.secrets += 1;
                }
            }
            Err(_) => done.unopenable.push(format!("secret:{name}")),
        }
    }
    for (id, action_ref, parameters) in secret::schedules_with_sealed(&pool).await? {
        let (now, changed) = resealed(&sealer, action_ref.as_str(), &parameters, &format!("schedule:{id}"), &mut done);
        if changed > 0 && secret::reseal_parameters(&pool, secret::Holder::Schedule(id), &parameters, &now).await? {
            done.schedule_parameters += changed;
        }
    }
    let mut after = 0;
    loop {
        let batch = secret::executions_with_sealed(&pool, after, BATCH).await?;
        for (id, action_ref, parameters) in &batch {
            let (now, changed) = resealed(&sealer, action_ref, parameters, &format!("execution:{id}"), &mut done);
            if changed > 0 && secret::reseal_parameters(&pool, secret::Holder::Execution(*id), parameters, &now).await?
            {
                done.parameters += changed;
            }
        }
        match batch.last() {
            Some((id, _, _)) if batch.len() as i64 == BATCH => after = *id,
            _ => break,
        }
    }
    audit(&pool, &done, reason).await?;
    match out {
        Output::Json => attune_cli::say!("{}", json!(done)),
        Output::Table => attune_cli::say!(
            "resealed with the key in force: {} secrets, {} sealed parameters of executions and {} of schedules ({} were already); {} open with no key{}",
            done.secrets,
            done.parameters,
            done.schedule_parameters,
            done.current,
            done.unopenable.len(),
            if done.unopenable.is_empty() { String::new() } else { format!(": {}", done.unopenable.join(", ")) }
        ),
    }
    Ok(if done.unopenable.is_empty() { 0 } else { 1 })
}

/// `parameters` (of `action_ref`, named `what` in a report) with each sealed value sealed again
/// with the key in force, and how many were; those already sealed with it, and those no key
/// opens, are counted in `done`.
fn resealed(sealer: &Sealer, action_ref: &str, parameters: &Value, what: &str, done: &mut Resealed) -> (Value, u64) {
    let Some(given) = parameters.as_object() else { return (parameters.clone(), 0) };
    let mut now = given.clone();
    let mut changed = 0;
    for (name, value) in given {
        match sealer.reseal_parameter(action_ref, name, value) {
            Ok(Some(resealed)) => {
                now.insert(name.clone(), resealed);
                changed += 1;
            }
            Ok(None) => done.current += u64::from(value.get(attune_common::secrets::SEALED_KEY).is_some()),
            Err(_) => done.unopenable.push(format!("{what}.{name}")),
        }
    }
    (Value::Object(now), changed)
}

/// The audit row of the reseal, by `cli:<the user running the command>`.
async fn audit(pool: &sqlx::PgPool, done: &Resealed, reason: Option<&str>) -> anyhow::Result<()> {
    let target = format!("secrets:{}+{}+{}", done.secrets, done.parameters, done.schedule_parameters);
    let event = crate::tokens::cli_event("secret reseal", &target, reason);
    attune_common::db::audit::insert_many(pool, &[event]).await.context("writing the audit event")?;
    Ok(())
}
