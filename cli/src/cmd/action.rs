//! `attune action list | get` and `attune concurrency`: the registered actions
//! (`db::action::Action`), and the parameters a command gives one, typed by its declaration.

use anyhow::{Context, bail};
use attune_cli::client::{Answer, Client};
use attune_cli::output::{shown, text};
use attune_common::db::action::Action;
use serde_json::{Map, Value, json};

use super::{encode, print, print_list};
use crate::Output;

/// The action `action_ref`.
pub async fn get_action(client: &Client, action_ref: &str) -> anyhow::Result<Answer<Action>> {
    client.get(&format!("/api/v1/actions/{}", encode(action_ref)), &[]).await
}

/// `attune action list [--pack PACK]`
pub async fn list(client: &Client, out: Output, pack: Option<String>) -> anyhow::Result<i32> {
    let mut actions: Vec<Answer<Action>> = client.get("/api/v1/actions", &[]).await?;
    actions.retain(|a| pack.as_deref().is_none_or(|pack| a.pack_ref == pack));
    print_list(out, &actions, &["ACTION", "RUNTIME", "TIMEOUT", "RETRIES", "DESCRIPTION"], |a| {
        vec![
            a.action_ref.clone(),
            a.runtime.clone(),
            shown(&a.timeout_seconds),
            shown(&a.max_retries),
            shown(&a.description),
        ]
    });
    Ok(0)
}

/// `attune action get REF`: the action as JSON, whatever the output.
pub async fn get(client: &Client, out: Output, action_ref: &str) -> anyhow::Result<i32> {
    let action = get_action(client, action_ref).await?;
    print(out, &action, |a| serde_json::to_string_pretty(a.json()).unwrap_or_default());
    Ok(0)
}

/// How `attune concurrency` changes the action's policy.
pub enum Policy {
    /// Only show it.
    Show,
    /// An operator's, in place of the pack's: at most `limit` at once (`None`: no limit), per
    /// value of `key`.
    Set { limit: Option<i64>, key: Option<String>, reason: String },
    /// The operator's ended: the pack's is in force again.
    Clear,
}

impl Policy {
    /// The change the flags ask for: `--clear`, else `--limit N` or `--no-limit` (which need a
    /// reason), else none.
    pub fn asked(
        limit: Option<i64>,
        key: Option<String>,
        no_limit: bool,
        clear: bool,
        reason: Option<String>,
    ) -> anyhow::Result<Policy> {
        if clear {
            return Ok(Policy::Clear);
        }
        if limit.is_none() && !no_limit {
            return Ok(Policy::Show);
        }
        let Some(reason) = reason else { bail!("a concurrency policy needs --reason: say why") };
        Ok(Policy::Set { limit, key, reason })
    }
}

/// `attune concurrency REF [--limit N [--key PARAM] | --no-limit | --clear]`
pub async fn concurrency(client: &Client, out: Output, action_ref: &str, policy: Policy) -> anyhow::Result<i32> {
    let path = format!("/api/v1/actions/{}/concurrency", encode(action_ref));
    let action: Answer<Action> = match policy {
        Policy::Clear => client.delete(&path).await?,
        Policy::Set { limit, key, reason } => {
            client.put(&path, &json!({"limit": limit, "key": key, "reason": reason})).await?
        }
        Policy::Show => get_action(client, action_ref).await?,
    };
    print(out, &action, |a| {
        // (both JSON as the API's type has them: `{limit, key}` and a `ConcurrencySet`)
        let in_force = a.concurrency.clone().unwrap_or_default();
        let policy = match (&in_force["limit"], in_force["key"].as_str()) {
            (Value::Null, _) => "no limit".to_string(),
            (limit, None) => format!("at most {limit} at once"),
            (limit, Some(key)) => format!("at most {limit} at once per value of '{key}'"),
        };
        let source = match &a.concurrency_set {
            None => "its pack's".to_string(),
            Some(set) => format!(
                "an operator's (token {}, {}: {})",
                text(&set["set_by"]),
                text(&set["set_at"]),
                text(&set["reason"])
            ),
        };
        format!("{}: {policy}, {source}", a.action_ref)
    });
    Ok(0)
}

/// `key=value` pairs typed by the action's declared parameters: strings stay as written, other
/// types are parsed as JSON (`count=3`, `verbose=true`, `tags=["a","b"]`).
pub fn parse_params(declared: &Value, pairs: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut parameters = Map::new();
    for pair in pairs {
        let Some((key, raw)) = pair.split_once('=') else {
            bail!("parameter '{pair}' is not key=value");
        };
        let value = match declared[key]["type"].as_str() {
            Some("string") | None => Value::String(raw.to_string()),
            Some(kind) => serde_json::from_str(raw)
                .with_context(|| format!("parameter '{key}': '{raw}' is not a valid {kind}"))?,
        };
        parameters.insert(key.to_string(), value);
    }
    Ok(parameters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_typed_by_their_declaration() {
        let declared =
            json!({"message": {"type": "string"}, "count": {"type": "integer"}, "flag": {"type": "boolean"}});
        let pairs = ["message=42".to_string(), "count=3".into(), "flag=true".into(), "extra=a=b".into()];
        let parsed = parse_params(&declared, &pairs).unwrap();
        assert_eq!(Value::Object(parsed), json!({"message": "42", "count": 3, "flag": true, "extra": "a=b"}));
        assert!(parse_params(&declared, &["count=three".into()]).unwrap_err().to_string().contains("count"));
        assert!(parse_params(&declared, &["novalue".into()]).is_err());
    }
}
