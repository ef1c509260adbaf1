//! `attune webhook | rule | event`: the packs' webhooks (`db::events::WebhookInfo`), their rules
//! (`db::events::Rule`), and the events received with each rule's answer
//! (`db::events::ReceivedEvent`), as the API's `routes::events` serves them.

use anyhow::Context;
use attune_api::routes::events::{CredentialSet, Recorded};
use attune_cli::client::{Answer, Client};
use attune_cli::output::{self, shown};
use attune_cli::tail::escaped;
use attune_common::db::events::{ReceivedEvent, Rule, WebhookInfo};
use serde::de::IgnoredAny;
use serde_json::json;

use super::{print, print_list, value_from_stdin};
use crate::Output;

/// `attune webhook list`
pub async fn list_webhooks(client: &Client, out: Output) -> anyhow::Result<i32> {
    let hooks: Vec<Answer<WebhookInfo>> = client.get("/api/v1/webhooks", &[]).await?;
    print_list(out, &hooks, &["NAME", "PACK", "AUTH", "MAX BYTES", "CREDENTIAL SET"], |w| {
        let set = if w.credential_set.is_none() { "no".into() } else { shown(&w.credential_set) };
        vec![w.name.clone(), w.pack.clone(), w.auth.clone(), w.max_bytes.to_string(), set]
    });
    Ok(0)
}

/// `attune webhook credential NAME [--value-stdin]`: a token webhook's new token, shown once, or
/// a signed one's key from stdin.
pub async fn set_credential(client: &Client, out: Output, name: &str, value_stdin: bool) -> anyhow::Result<i32> {
    let body = if value_stdin { json!({"value": value_from_stdin()?}) } else { json!({}) };
    let set: Answer<CredentialSet> = client.put(&format!("/api/v1/webhooks/{name}/credential"), &body).await?;
    print(out, &set, |set| match &set.token {
        Some(token) => format!(
            "webhook {name}: token set (shown once; attune keeps only its hash)\n{token}\nsend it as X-Attune-Webhook-Token"
        ),
        None => format!("webhook {name}: credential set"),
    });
    Ok(0)
}

/// `attune rule list`
pub async fn list_rules(client: &Client, out: Output) -> anyhow::Result<i32> {
    let rules: Vec<Answer<Rule>> = client.get("/api/v1/rules", &[]).await?;
    print_list(out, &rules, &["RULE", "TRIGGER", "ACTION", "ENABLED"], |r| {
        vec![r.rule_ref.clone(), r.trigger.clone(), r.action_ref.clone(), r.enabled.to_string()]
    });
    Ok(0)
}

/// `attune rule create FILE`: the file is read as a pack's `rules/NAME.yaml`, its errors naming
/// the file and the field before anything is sent.
pub async fn create_rule(client: &Client, out: Output, file: &std::path::Path) -> anyhow::Result<i32> {
    let written = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let spec = attune_core::rules::parse_rule(file, &written)?;
    let made: Answer<Rule> = client.post("/api/v1/rules", &spec).await?;
    print(out, &made, |r| format!("rule {} made: {} -> {}", r.rule_ref, r.trigger, r.action_ref));
    Ok(0)
}

/// `attune rule enable | disable RULE`
pub async fn set_rule_enabled(client: &Client, out: Output, rule: &str, enabled: bool) -> anyhow::Result<i32> {
    let set: Answer<Rule> = client.put(&format!("/api/v1/rules/{rule}/enabled"), &json!({"enabled": enabled})).await?;
    print(out, &set, |r| format!("rule {}: {}", r.rule_ref, if enabled { "enabled" } else { "disabled" }));
    Ok(0)
}

/// `attune rule delete RULE`
pub async fn delete_rule(client: &Client, out: Output, rule: &str) -> anyhow::Result<i32> {
    let _: IgnoredAny = client.delete(&format!("/api/v1/rules/{rule}")).await?;
    print(out, &json!({"deleted": rule}), |_| format!("rule {rule} deleted"));
    Ok(0)
}

/// `attune event list [--trigger T] [--limit N]`: a row per event and rule.
pub async fn list(client: &Client, out: Output, trigger: Option<String>, limit: u32) -> anyhow::Result<i32> {
    let mut query = vec![("limit", limit.to_string())];
    query.extend(trigger.map(|t| ("trigger", t)));
    let events: Vec<Answer<ReceivedEvent>> = client.get("/api/v1/events", &query).await?;
    print(out, &events, |list| {
        let mut rows = Vec::new();
        for e in list {
            let (id, received) = (e.id.to_string(), shown(&e.received));
            if e.matches.is_empty() {
                rows.push(vec![id.clone(), received.clone(), e.trigger.clone(), "-".into(), "no rule".into()]);
            }
            for m in &e.matches {
                let what = match m.execution {
                    Some(id) => format!("execution {id}"),
                    None => m.reason.as_deref().map(|r| escaped(r).into_owned()).unwrap_or_default(),
                };
                rows.push(vec![id.clone(), received.clone(), e.trigger.clone(), m.rule.clone(), what]);
            }
        }
        output::table(&["EVENT", "RECEIVED", "TRIGGER", "RULE", "MADE"], &rows)
    });
    Ok(0)
}

/// `attune event get ID`: the event as JSON, whatever the output.
pub async fn get(client: &Client, out: Output, id: i64) -> anyhow::Result<i32> {
    let event: Answer<ReceivedEvent> = client.get(&format!("/api/v1/events/{id}"), &[]).await?;
    print(out, &event, |e| serde_json::to_string_pretty(e.json()).unwrap_or_default());
    Ok(0)
}

/// `attune event replay ID`
pub async fn replay(client: &Client, out: Output, id: i64) -> anyhow::Result<i32> {
    let recorded: Answer<Recorded> = client.post(&format!("/api/v1/events/{id}/replay"), &json!({})).await?;
    print(out, &recorded, |r| format!("event {id} replayed as event {}", r.event));
    Ok(0)
}
