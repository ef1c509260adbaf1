//! Events in (ADR 0013): webhooks a pack declares (`webhooks/NAME.yaml`) and rules
//! (`rules/NAME.yaml`) that turn an event of a trigger into an execution of an action, when the
//! event meets their criteria and the rule's cooldown and rate allow it.
//!
//! A rule speaks the workflows' expression language (`crate::workflow::expr`) over the event:
//! `{{ payload.host }}`, `{{ event.trigger }}`. Its criteria are conditions, all of which must
//! hold; the first that does not is the reason recorded for the event. Its parameters are
//! templates rendered from the event; a stored secret's reference comes only from the rule's own
//! file, never from what a sender sent. Everything here is a pure decision: the API records the
//! event, asks `evaluate`, and carries the answer out in the event's transaction.

use std::collections::BTreeMap;
use std::path::Path as FilePath;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::pack::{PackError, parse_yaml};
use crate::workflow::expr::{Condition, Dialect, paths_in, render_in};

/// A rule's roots: the event (`event.trigger`, `event.id`) and what it carried (`payload`).
pub const RULE: Dialect = Dialect { roots: &["event", "payload"], trusted: None };

/// attune's own triggers (migration `20261208000000_own_events.sql`): an execution ended; ended
/// without success; ended without success with no retry to follow; ran out of time; a worker
/// turned unhealthy; an action's circuit opened. Their payloads are `{"execution": {...}}`,
/// `{"worker": {...}}` and `{"circuit": {...}}`.
pub const OWN_TRIGGERS: [&str; 6] = [
    "attune.execution.finished",
    "attune.execution.failed",
    "attune.execution.exhausted",
    "attune.execution.timed_out",
    "attune.worker.unhealthy",
    "attune.circuit.opened",
];

/// Whether `trigger` is one of attune's own: what its rules make raises no event of its own.
pub fn is_own(trigger: &str) -> bool {
    trigger.starts_with("attune.")
}

/// The most bytes a webhook takes unless its file says otherwise, and the most it may say.
pub const DEFAULT_MAX_BYTES: u32 = 256 * 1024;
pub const MAX_MAX_BYTES: u32 = 16 * 1024 * 1024;

/// How a webhook's sender proves itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookAuth {
    /// A token of the webhook's own (`X-Attune-Webhook-Token`, or `Authorization: Bearer`),
    /// made by `attune webhook credential NAME` and stored hashed.
    Token,
    /// GitHub's `X-Hub-Signature-256: sha256=HEX`, an HMAC-SHA256 of the body.
    Github,
    /// Stripe's `Stripe-Signature: t=TIME,v1=HEX`, an HMAC-SHA256 of `TIME.BODY`, within 5 minutes.
    Stripe,
    /// A generic `X-Signature: sha256=HEX` (or the bare hex), an HMAC-SHA256 of the body.
    Hmac,
}

impl WebhookAuth {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookAuth::Token => "token",
            WebhookAuth::Github => "github",
            WebhookAuth::Stripe => "stripe",
            WebhookAuth::Hmac => "hmac",
        }
    }

    /// Whether its credential is a key the API must read back (a signature's), not a token it
    /// keeps only the hash of.
    pub fn signs(self) -> bool {
        !matches!(self, WebhookAuth::Token)
    }
}

/// `webhooks/NAME.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    pub name: String,
    pub auth: WebhookAuth,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The largest body taken (bytes; 256 KiB by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u32>,
}

/// `cooldown:` of a rule: once it has made an execution for a key, it makes none for that key
/// for `for` (`90s`, `10m`, `2h`, `1d`, or seconds).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Cooldown {
    /// A payload field (`host`, `labels.instance`) or a template (`{{ payload.host }}`).
    pub key: String,
    #[serde(rename = "for")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub period: Value,
}

/// `rate:` of a rule: at most `most` executions in any `per` (a duration, as `cooldown.for`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Rate {
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub most: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub per: Value,
}

/// `rules/NAME.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[A-Za-z0-9_-]{1,128}$"))]
    pub name: String,
    /// `webhook.NAME`: the events of a webhook (of any pack's); `schedule.NAME`: a schedule's
    /// occurrences; or one of attune's own ([`OWN_TRIGGERS`]), `attune.execution.exhausted` say.
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = r"^(webhook\.[A-Za-z0-9_-]{1,128}|schedule\.[^/]{1,255}|attune\.(execution\.(finished|failed|exhausted|timed_out)|worker\.unhealthy|circuit\.opened))$"
        )
    )]
    pub trigger: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Conditions on the event, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub criteria: Vec<String>,
    /// The action (or workflow) to run, `pack.name`.
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128}$"))]
    pub action: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub parameters: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown: Option<Cooldown>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    #[serde(default = "enabled", skip_serializing_if = "is_true")]
    pub enabled: bool,
}

fn enabled() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

/// A name of a pack's rule or webhook: what an action's name may be.
fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

/// Parses `webhooks/NAME.yaml`; errors name the file and the field.
pub fn parse_webhook(file: &FilePath, text: &str) -> Result<WebhookSpec, PackError> {
    let spec: WebhookSpec = parse_yaml(file, text)?;
    if !valid_name(&spec.name) {
        return Err(PackError::new(file, Some("name"), "a webhook's name is 1 to 128 letters, digits, '_' or '-'"));
    }
    if spec.max_bytes.is_some_and(|n| n == 0 || n > MAX_MAX_BYTES) {
        return Err(PackError::new(file, Some("max_bytes"), format!("must be between 1 and {MAX_MAX_BYTES}")));
    }
    Ok(spec)
}

/// Parses `rules/NAME.yaml`; errors name the file and the field.
pub fn parse_rule(file: &FilePath, text: &str) -> Result<RuleSpec, PackError> {
    let spec: RuleSpec = parse_yaml(file, text)?;
    check_rule(&spec).map_err(|(field, reason)| PackError::new(file, Some(&field), reason))?;
    Ok(spec)
}

/// The checks of a rule that need nothing but the rule: `(field, reason)`.
pub fn check_rule(spec: &RuleSpec) -> Result<(), (String, String)> {
    let field = |name: &str| name.to_string();
    if !valid_name(&spec.name) {
        return Err((field("name"), "a rule's name is 1 to 128 letters, digits, '_' or '-'".into()));
    }
    match spec.trigger.split_once('.') {
        Some(("webhook", name)) if valid_name(name) => {}
        Some(("schedule", name)) if (1..=255).contains(&name.chars().count()) && !name.contains('/') => {}
        _ if OWN_TRIGGERS.contains(&spec.trigger.as_str()) => {}
        _ => {
            return Err((
                field("trigger"),
                format!(
                    "'{}' is not a trigger (expected webhook.NAME, a webhook of a pack; schedule.NAME, a schedule's \
                     occurrences; or one of attune's own: {})",
                    spec.trigger,
                    OWN_TRIGGERS.join(", ")
                ),
            ));
        }
    }
    match spec.action.split_once('.') {
        Some((pack, name)) if valid_name(pack) && valid_name(name) => {}
        _ => return Err((field("action"), format!("'{}' is not an action's ref (pack.name)", spec.action))),
    }
    for (n, criterion) in spec.criteria.iter().enumerate() {
        Condition::parse_in(criterion, &RULE).map_err(|e| (format!("criteria.{n}"), e))?;
    }
    for (name, template) in &spec.parameters {
        paths_in(template, &RULE).map_err(|e| (format!("parameters.{name}"), e))?;
    }
    if let Some(cooldown) = &spec.cooldown {
        cooldown_key_template(&cooldown.key).map_err(|e| ("cooldown.key".to_string(), e))?;
        seconds(&cooldown.period).map_err(|e| ("cooldown.for".to_string(), e))?;
    }
    if let Some(rate) = &spec.rate {
        if rate.most == 0 {
            return Err(("rate.most".into(), "must be at least 1 (disable the rule instead: enabled: false)".into()));
        }
        seconds(&rate.per).map_err(|e| ("rate.per".to_string(), e))?;
    }
    Ok(())
}

/// A cooldown's key as a template: a field of the payload (`host`) or a template already.
fn cooldown_key_template(key: &str) -> Result<Value, String> {
    let template = if key.contains("{{") { key.to_string() } else { format!("{{{{ payload.{} }}}}", key.trim()) };
    let value = Value::String(template);
    paths_in(&value, &RULE)?;
    Ok(value)
}

/// A duration as a rule writes it: seconds as a number, or a number and `s`, `m`, `h` or `d`.
pub fn seconds(value: &Value) -> Result<u64, String> {
    let parsed = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(text) => {
            let text = text.trim();
            let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
            let scale = match unit.trim() {
                "" | "s" => Some(1),
                "m" => Some(60),
                "h" => Some(3600),
                "d" => Some(86_400),
                _ => None,
            };
            digits.parse::<u64>().ok().zip(scale).and_then(|(n, scale)| n.checked_mul(scale))
        }
        _ => None,
    };
    match parsed {
        Some(secs) if (1..=365 * 86_400).contains(&secs) => Ok(secs),
        _ => Err(format!("{value} is not a duration of 1 s to 365 d (e.g. 90, '90s', '10m', '2h', '1d')")),
    }
}

/// What a rule makes of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A criterion did not hold (or could not be read: the reason says which and why).
    NoMatch { reason: String },
    /// It matched, but its parameters or cooldown key could not be made from the event.
    Error { reason: String },
    /// It matched: run `action` with `parameters`, unless `cooldown` (key, seconds) or the rate
    /// (most, seconds) says no.
    Run { parameters: Value, cooldown: Option<(String, u64)>, rate: Option<(u32, u64)> },
}

/// The scope a rule's expressions read: `event` (its id and trigger) and `payload`.
pub fn scope(event_id: i64, trigger: &str, payload: &Value) -> Value {
    serde_json::json!({"event": {"id": event_id, "trigger": trigger}, "payload": payload})
}

/// What `rule` makes of the event whose scope is `scope` (see [`scope`]).
pub fn evaluate(rule: &RuleSpec, scope: &Value) -> Decision {
    for (n, criterion) in rule.criteria.iter().enumerate() {
        let held = Condition::parse_in(criterion, &RULE).and_then(|condition| condition.eval(scope));
        match held {
            Ok(true) => {}
            Ok(false) => return Decision::NoMatch { reason: format!("criteria.{n} is false: {criterion}") },
            Err(e) => return Decision::NoMatch { reason: format!("criteria.{n} cannot be read: {e}") },
        }
    }
    let template = Value::Object(rule.parameters.clone().into_iter().collect());
    let parameters = match render_in(&template, scope, &RULE) {
        Ok(parameters) => parameters,
        Err(e) => return Decision::Error { reason: format!("parameters: {e}") },
    };
    let cooldown = match &rule.cooldown {
        None => None,
        Some(cooldown) => {
            let key = cooldown_key_template(&cooldown.key)
                .and_then(|template| render_in(&template, scope, &RULE))
                .map(|key| crate::template::plain(&key));
            match (key, seconds(&cooldown.period)) {
                (Ok(key), Ok(secs)) => Some((key, secs)),
                (Err(e), _) | (_, Err(e)) => return Decision::Error { reason: format!("cooldown: {e}") },
            }
        }
    };
    let rate = match &rule.rate {
        None => None,
        Some(rate) => match seconds(&rate.per) {
            Ok(secs) => Some((rate.most, secs)),
            Err(e) => return Decision::Error { reason: format!("rate: {e}") },
        },
    };
    Decision::Run { parameters, cooldown, rate }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(yaml: &str) -> Result<RuleSpec, PackError> {
        parse_rule(FilePath::new("rules/r.yaml"), yaml)
    }

    const ALERT: &str = "name: restart\ntrigger: webhook.alerts\ncriteria:\n  - \"{{ payload.severity }} == 'critical'\"\naction: ops.restart\nparameters:\n  host: \"{{ payload.host }}\"\n  why: \"alert {{ payload.name }} on {{ payload.host }}\"\ncooldown: {key: host, for: 10m}\n";

    #[test]
    fn a_rule_matches_renders_and_keys_its_cooldown() {
        let spec = rule(ALERT).unwrap();
        let event = scope(7, "webhook.alerts", &json!({"severity": "critical", "host": "h1", "name": "down"}));
        assert_eq!(
            evaluate(&spec, &event),
            Decision::Run {
                parameters: json!({"host": "h1", "why": "alert down on h1"}),
                cooldown: Some(("h1".into(), 600)),
                rate: None
            }
        );
    }

    #[test]
    fn the_first_criterion_that_fails_is_the_reason() {
        let spec = rule(ALERT).unwrap();
        let warning = scope(7, "webhook.alerts", &json!({"severity": "warning", "host": "h1", "name": "x"}));
        assert_eq!(
            evaluate(&spec, &warning),
            Decision::NoMatch { reason: "criteria.0 is false: {{ payload.severity }} == 'critical'".into() }
        );
        let missing = scope(7, "webhook.alerts", &json!({"host": "h1"}));
        match evaluate(&spec, &missing) {
            Decision::NoMatch { reason } => assert!(reason.contains("payload has no 'severity'"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sender_chooses_no_secret() {
        let spec = rule("name: r\ntrigger: webhook.w\naction: p.a\nparameters: {token: '{{ payload.t }}'}\n").unwrap();
        let sent = scope(1, "webhook.w", &json!({"t": {"$secret": "db_password"}}));
        match evaluate(&spec, &sent) {
            Decision::Error { reason } => {
                assert!(reason.contains("only the definition itself names a secret"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_bad_rule_names_its_field() {
        for (yaml, field) in [
            ("name: r\ntrigger: cron.x\naction: p.a\n", "trigger"),
            ("name: r\ntrigger: attune.execution.lost\naction: p.a\n", "trigger"),
            ("name: r\ntrigger: webhook.w\naction: nodot\n", "action"),
            ("name: r\ntrigger: webhook.w\naction: p.a\ncriteria: ['{{ input.x }} == 1']\n", "criteria.0"),
            ("name: r\ntrigger: webhook.w\naction: p.a\nparameters: {x: '{{ steps.a }}'}\n", "parameters.x"),
            ("name: r\ntrigger: webhook.w\naction: p.a\ncooldown: {key: host, for: 10 minutes}\n", "cooldown.for"),
            ("name: r\ntrigger: webhook.w\naction: p.a\nrate: {most: 0, per: 1m}\n", "rate.most"),
            ("name: r\ntrigger: webhook.w\naction: p.a\nsurprise: 1\n", "surprise"),
        ] {
            let error = rule(yaml).unwrap_err();
            assert_eq!(error.field.as_deref(), Some(field), "{yaml}: {error}");
            assert!(error.to_string().starts_with("rules/r.yaml"), "{error}");
        }
    }

    #[test]
    fn attune_s_own_triggers_are_triggers() {
        for trigger in OWN_TRIGGERS {
            let yaml = format!("name: r\ntrigger: {trigger}\naction: core.notify_webhook\n");
            assert_eq!(rule(&yaml).unwrap().trigger, trigger);
            assert!(is_own(trigger));
        }
        assert!(!is_own("webhook.alerts"));
        assert_eq!(
            rule("name: r\ntrigger: schedule.nightly report\naction: p.a\n").unwrap().trigger,
            "schedule.nightly report"
        );
        assert!(rule("name: r\ntrigger: schedule.a/b\naction: p.a\n").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(seconds(&json!(90)), Ok(90));
        assert_eq!(seconds(&json!("90s")), Ok(90));
        assert_eq!(seconds(&json!("10m")), Ok(600));
        assert_eq!(seconds(&json!("2h")), Ok(7200));
        assert_eq!(seconds(&json!("1d")), Ok(86_400));
        assert!(seconds(&json!("0s")).is_err());
        assert!(seconds(&json!("1w")).is_err());
        assert!(seconds(&json!(-5)).is_err());
    }

    #[test]
    fn a_webhook_file() {
        let spec =
            parse_webhook(FilePath::new("webhooks/w.yaml"), "name: alerts\nauth: github\nmax_bytes: 1024\n").unwrap();
        assert_eq!((spec.auth, spec.max_bytes), (WebhookAuth::Github, Some(1024)));
        let error = parse_webhook(FilePath::new("webhooks/w.yaml"), "name: alerts\nauth: basic\n").unwrap_err();
        assert_eq!(error.field.as_deref(), Some("auth"), "{error}");
    }
}
