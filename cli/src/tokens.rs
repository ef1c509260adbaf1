//! `attune token create | list | revoke`: API tokens and their roles, through the database
//! (`DATABASE_URL`), so the first token can be made before any exists. The API's admin routes
//! (`/api/v1/tokens`) do the same over HTTP.

use std::time::Duration;

use anyhow::{Context, bail};
use attune_common::db::token::{self, TokenInfo};
use chrono::Utc;
use serde_json::json;
use sqlx::PgPool;

use crate::output;
use crate::{Output, TokenCommand};

pub async fn run(command: TokenCommand, out: Output, reason: Option<&str>) -> anyhow::Result<i32> {
    let pool = database().await?;
    match command {
        TokenCommand::Create { name, role, expires_in } => {
            let lifetime = match expires_in {
                Some(Lifetime::Never) => None,
                Some(Lifetime::For(lifetime)) => Some(lifetime),
                None => token::default_lifetime(&attune_common::config::Environment)?,
            };
            let expires = lifetime.map(|lifetime| Utc::now() + lifetime);
            // the token and its audit row in one transaction
            let mut transaction = pool.begin().await?;
            let (info, token) = token::create_with(&mut *transaction, &name, role, expires).await?;
            audit(&mut transaction, "token create", info.id, reason).await?;
            transaction.commit().await?;
            match out {
                Output::Json => {
                    let mut shown = serde_json::to_value(&info)?;
                    shown["token"] = json!(token);
                    attune_cli::say!("{shown}");
                }
                // the token alone, for `TOKEN=$(attune token create ...)`
                Output::Table => attune_cli::say!("{token}"),
            }
        }
        TokenCommand::List => {
            let tokens = token::list(&pool).await?;
            match out {
                Output::Json => attune_cli::say!("{}", serde_json::to_string_pretty(&tokens)?),
                Output::Table => attune_cli::say!("{}", table(&tokens)),
            }
        }
        TokenCommand::Revoke { token: which } => {
            let target = find(&pool, &which).await?;
            let mut transaction = pool.begin().await?;
            let revoked = token::revoke(&mut *transaction, target.id).await?.context("the token vanished")?;
            let why = format!("stopped: the token it runs as ({}, '{}') was revoked", revoked.id, revoked.name);
            attune_common::db::schedule::pause_made_by(&mut *transaction, revoked.id, &why).await?;
            audit(&mut transaction, "token revoke", revoked.id, reason).await?;
            transaction.commit().await?;
            match out {
                Output::Json => attune_cli::say!("{}", serde_json::to_string_pretty(&revoked)?),
                Output::Table => attune_cli::say!(
                    "revoked token {} ({}, {}) at {}",
                    revoked.id,
                    revoked.name,
                    revoked.role,
                    when(revoked.revoked)
                ),
            }
        }
    }
    Ok(0)
}

/// The audit row of a change made here, past the API: by `cli:<the user running the command>`.
async fn audit(
    transaction: &mut sqlx::PgConnection,
    what: &str,
    token_id: i64,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let event = cli_event(what, &format!("token:{token_id}"), reason);
    attune_common::db::audit::insert_many(transaction, &[event]).await.context("writing the audit event")?;
    Ok(())
}

/// The audit event of `attune <what>`, changing `target`, by `cli:<the user running the command>`.
pub(crate) fn cli_event(what: &str, target: &str, reason: Option<&str>) -> attune_common::db::audit::NewEvent {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    attune_common::db::audit::NewEvent {
        token_id: None,
        role: None,
        actor: Some(format!("cli:{user}")),
        method: "CLI".into(),
        route: what.into(),
        path: format!("attune {what}"),
        status: 0,
        target: Some(target.to_string()),
        reason: reason.map(str::to_string),
    }
}

async fn database() -> anyhow::Result<PgPool> {
    let url: String = attune_common::settings::get("DATABASE_URL")?;
    let pool = attune_common::db::connect(&url, 1, Duration::from_secs(10))
        .await
        .with_context(|| "cannot connect to the database (DATABASE_URL)")?;
    attune_common::db::check_schema(&pool).await?;
    Ok(pool)
}

/// The token `which` names: an id (all digits) if a token has it, else the one live token of that
/// name (several are refused: revoke by id then).
async fn find(pool: &PgPool, which: &str) -> anyhow::Result<TokenInfo> {
    if let Ok(id) = which.parse::<i64>()
        && let Some(found) = token::get(pool, id).await?
    {
        return Ok(found);
    }
    let named = token::named(pool, which).await?;
    let live: Vec<&TokenInfo> = named.iter().filter(|t| t.revoked.is_none()).collect();
    match live.as_slice() {
        [one] => Ok((*one).clone()),
        [] if named.is_empty() => bail!("no token has the id or name '{which}' (attune token list shows them)"),
        [] => bail!("every token called '{which}' is revoked already"),
        several => {
            let ids: Vec<String> = several.iter().map(|t| t.id.to_string()).collect();
            bail!("{} live tokens are called '{which}' (ids {}): revoke one by its id", several.len(), ids.join(", "))
        }
    }
}

/// A time as the tables show it (in UTC, to the second), `-` for none.
fn when(time: Option<chrono::DateTime<Utc>>) -> String {
    time.map_or_else(|| "-".to_string(), |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
}

fn table(tokens: &[TokenInfo]) -> String {
    let now = Utc::now();
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            let state = match (t.revoked, t.expires) {
                (Some(_), _) => "revoked",
                (None, Some(expires)) if expires <= now => "expired",
                _ => "live",
            };
            vec![
                t.id.to_string(),
                t.name.clone(),
                t.role.to_string(),
                state.to_string(),
                when(Some(t.created)),
                when(t.expires),
                when(t.revoked),
            ]
        })
        .collect();
    output::table(&["id", "name", "role", "state", "created", "expires", "revoked"], &rows)
}

/// `--expires-in`: a lifetime (`parse_lifetime`) or `never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    Never,
    For(chrono::Duration),
}

pub fn parse_expires_in(text: &str) -> Result<Lifetime, String> {
    match text {
        "never" => Ok(Lifetime::Never),
        _ => token::parse_lifetime(text).map(Lifetime::For),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_are_a_number_and_a_unit_from_a_second_to_ten_years_or_never() {
        let secs = |text| match parse_expires_in(text) {
            Ok(Lifetime::For(d)) => Ok(d.num_seconds()),
            Ok(Lifetime::Never) => Ok(-1),
            Err(e) => Err(e),
        };
        assert_eq!(secs("never"), Ok(-1));
        assert_eq!(secs("30d"), Ok(30 * 86_400));
        assert_eq!(secs("12h"), Ok(12 * 3600));
        assert_eq!(secs("90m"), Ok(5400));
        assert_eq!(secs("1s"), Ok(1));
        assert_eq!(secs("2w"), Ok(14 * 86_400));
        assert_eq!(secs("3650d"), Ok(3650 * 86_400));
        for bad in ["", "30", "d", "0d", "3651d", "-1d", "1.5h", "30 d", "30days", "99999999999999999999w"] {
            assert!(parse_expires_in(bad).is_err(), "{bad:?} was taken");
        }
    }
}
