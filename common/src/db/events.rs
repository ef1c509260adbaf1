//! Webhooks, rules, events and what each rule made of each event (migration
//! `20261207000000_events.sql`, ADR 0013).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use attune_core::pack::LoadedPack;
use attune_core::rules::{DEFAULT_MAX_BYTES, RuleSpec};

/// A webhook's row, credentials included (the API's alone: never answered).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Webhook {
    pub name: String,
    pub pack: String,
    pub auth: String,
    pub max_bytes: i32,
    pub token_sha256: Option<String>,
    pub signing_key: Option<Vec<u8>>,
}

/// A webhook as listed: whether its credential is set, never the credential.
#[derive(Debug, Clone, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct WebhookInfo {
    pub name: String,
    pub pack: String,
    /// `token`, `github`, `stripe` or `hmac`.
    pub auth: String,
    pub max_bytes: i32,
    pub description: Option<String>,
    /// When an admin last set its token or key; null: it takes no delivery yet.
    pub credential_set: Option<DateTime<Utc>>,
}

/// A rule as listed.
#[derive(Debug, Clone, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Rule {
    #[sqlx(rename = "ref")]
    #[serde(rename = "ref")]
    pub rule_ref: String,
    pub pack: String,
    pub trigger: String,
    pub action_ref: String,
    pub enabled: bool,
    /// The file as loaded (or the definition an operator sent): criteria, parameters, cooldown,
    /// rate.
    #[schema(value_type = Object)]
    pub definition: Value,
    pub updated: DateTime<Utc>,
    /// The token that made it through the API (its pack is `local`); null: a pack's file.
    pub made_by: Option<i64>,
    /// The token that last enabled or disabled it by hand, which a pack's registration then
    /// leaves as it is; null: as its file says.
    pub enabled_by: Option<i64>,
}

const RULE_COLUMNS: &str = "ref, pack, trigger, action_ref, enabled, definition, updated, made_by, enabled_by";

/// The pack of the rules operators make through the API.
pub const LOCAL_PACK: &str = "local";

/// The webhooks and rules of pack `pack` become `webhooks` and `rules` (in the pack's
/// registration transaction): others of the pack go; a webhook kept keeps its credential (while
/// its kind of proof stays the same). A webhook's name is the sender's URL: another pack's is
/// refused, naming the file.
pub async fn register(tx: &mut PgConnection, pack: &LoadedPack) -> Result<(), crate::db::pack::RegisterError> {
    let (pack_ref, webhooks, rules) = (&pack.manifest.pack_ref, &pack.webhooks, &pack.rules);
    let mut names = Vec::new();
    for webhook in webhooks {
        let taken = sqlx::query(
            "INSERT INTO webhook (name, pack, auth, max_bytes, description) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (name) DO UPDATE SET pack = EXCLUDED.pack, max_bytes = EXCLUDED.max_bytes, \
                description = EXCLUDED.description, updated = now(), \
                auth = EXCLUDED.auth, \
                token_sha256 = CASE WHEN webhook.auth = EXCLUDED.auth THEN webhook.token_sha256 END, \
                signing_key = CASE WHEN webhook.auth = EXCLUDED.auth THEN webhook.signing_key END, \
                credential_set = CASE WHEN webhook.auth = EXCLUDED.auth THEN webhook.credential_set END \
             WHERE webhook.pack = EXCLUDED.pack",
        )
        .bind(&webhook.name)
        .bind(pack_ref)
        .bind(webhook.auth.as_str())
        .bind(i64::from(webhook.max_bytes.unwrap_or(DEFAULT_MAX_BYTES)))
        .bind(&webhook.description)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 0;
        if taken {
            let file = pack.path.join("webhooks").join(format!("{}.yaml", webhook.name));
            let reason = format!("webhook '{}' belongs to another pack", webhook.name);
            return Err(crate::pack::PackError::new(&file, Some("name"), reason).into());
        }
        names.push(webhook.name.clone());
    }
    sqlx::query("DELETE FROM webhook WHERE pack = $1 AND NOT (name = ANY($2))")
        .bind(pack_ref)
        .bind(&names)
        .execute(&mut *tx)
        .await?;
    let mut refs = Vec::new();
    for rule in rules {
        let definition = serde_json::to_value(&rule.spec).unwrap_or(Value::Null);
        let taken = sqlx::query(
            "INSERT INTO rule (ref, pack, trigger, action_ref, enabled, definition) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (ref) DO UPDATE SET pack = EXCLUDED.pack, trigger = EXCLUDED.trigger, \
                action_ref = EXCLUDED.action_ref, definition = EXCLUDED.definition, updated = now(), \
                enabled = CASE WHEN rule.enabled_by IS NULL THEN EXCLUDED.enabled ELSE rule.enabled END \
             WHERE rule.made_by IS NULL",
        )
        .bind(&rule.rule_ref)
        .bind(pack_ref)
        .bind(&rule.spec.trigger)
        .bind(&rule.spec.action)
        .bind(rule.spec.enabled)
        .bind(&definition)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 0;
        if taken {
            let file = pack.path.join("rules").join(format!("{}.yaml", rule.spec.name));
            let reason = format!("rule '{}' was made through the API: delete it there first", rule.rule_ref);
            return Err(crate::pack::PackError::new(&file, Some("name"), reason).into());
        }
        refs.push(rule.rule_ref.clone());
    }
    sqlx::query("DELETE FROM rule WHERE pack = $1 AND made_by IS NULL AND NOT (ref = ANY($2))")
        .bind(pack_ref)
        .bind(&refs)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

pub async fn webhook(db: impl PgExecutor<'_>, name: &str) -> Result<Option<Webhook>, sqlx::Error> {
    sqlx::query_as("SELECT name, pack, auth, max_bytes, token_sha256, signing_key FROM webhook WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await
}

pub async fn webhooks(db: impl PgExecutor<'_>) -> Result<Vec<WebhookInfo>, sqlx::Error> {
    sqlx::query_as("SELECT name, pack, auth, max_bytes, description, credential_set FROM webhook ORDER BY name")
        .fetch_all(db)
        .await
}

/// Sets webhook `name`'s token (its SHA-256) or its sealed signing key; `None` if there is no
/// such webhook.
pub async fn set_credential(
    db: impl PgExecutor<'_>,
    name: &str,
    token_sha256: Option<&str>,
    signing_key: Option<&[u8]>,
) -> Result<Option<WebhookInfo>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE webhook SET token_sha256 = $2, signing_key = $3, credential_set = now(), updated = now() \
         WHERE name = $1 RETURNING name, pack, auth, max_bytes, description, credential_set",
    )
    .bind(name)
    .bind(token_sha256)
    .bind(signing_key)
    .fetch_optional(db)
    .await
}

pub async fn rules(db: impl PgExecutor<'_>) -> Result<Vec<Rule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {RULE_COLUMNS} FROM rule ORDER BY ref"))).fetch_all(db).await
}

/// Rule `rule_ref`.
pub async fn rule(db: impl PgExecutor<'_>, rule_ref: &str) -> Result<Option<Rule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT {RULE_COLUMNS} FROM rule WHERE ref = $1")))
        .bind(rule_ref)
        .fetch_optional(db)
        .await
}

/// Makes rule `local.NAME` of `spec` for token `made_by`; `None` when that ref is taken.
pub async fn create_rule(db: impl PgExecutor<'_>, spec: &RuleSpec, made_by: i64) -> Result<Option<Rule>, sqlx::Error> {
    let definition = serde_json::to_value(spec).unwrap_or(Value::Null);
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO rule (ref, pack, trigger, action_ref, enabled, definition, made_by) \
         VALUES ($1 || '.' || $2, $1, $3, $4, $5, $6, $7) ON CONFLICT (ref) DO NOTHING RETURNING {RULE_COLUMNS}"
    )))
    .bind(LOCAL_PACK)
    .bind(&spec.name)
    .bind(&spec.trigger)
    .bind(&spec.action)
    .bind(spec.enabled)
    .bind(&definition)
    .bind(made_by)
    .fetch_optional(db)
    .await
}

/// Enables or disables rule `rule_ref` by hand (token `by`); `None`: no such rule.
pub async fn set_enabled(
    db: impl PgExecutor<'_>,
    rule_ref: &str,
    enabled: bool,
    by: i64,
) -> Result<Option<Rule>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE rule SET enabled = $2, enabled_by = $3, enabled_at = now(), updated = now() WHERE ref = $1 \
         RETURNING {RULE_COLUMNS}"
    )))
    .bind(rule_ref)
    .bind(enabled)
    .bind(by)
    .fetch_optional(db)
    .await
}

/// Deletes rule `rule_ref` if it was made through the API; `false` when it was not (or is gone).
/// Its events' answers stay, naming it.
pub async fn delete_made_rule(db: impl PgExecutor<'_>, rule_ref: &str) -> Result<bool, sqlx::Error> {
    let deleted =
        sqlx::query("DELETE FROM rule WHERE ref = $1 AND made_by IS NOT NULL").bind(rule_ref).execute(db).await?;
    Ok(deleted.rows_affected() == 1)
}

/// The enabled rules of `trigger`, in ref order, with their files as loaded.
pub async fn rules_of(db: impl PgExecutor<'_>, trigger: &str) -> Result<Vec<(String, RuleSpec)>, sqlx::Error> {
    let rows: Vec<(String, Value)> =
        sqlx::query_as("SELECT ref, definition FROM rule WHERE trigger = $1 AND enabled ORDER BY ref")
            .bind(trigger)
            .fetch_all(db)
            .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(rule_ref, definition)| serde_json::from_value(definition).ok().map(|spec| (rule_ref, spec)))
        .collect())
}

/// An event, with what each rule made of it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ReceivedEvent {
    pub id: i64,
    pub trigger: String,
    pub delivery: Option<String>,
    #[schema(value_type = Object)]
    pub payload: Value,
    pub received: DateTime<Utc>,
    pub replay_of: Option<i64>,
    #[sqlx(skip)]
    pub matches: Vec<Match>,
}

/// A rule's answer to an event.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Match {
    pub rule: String,
    /// Whether its criteria held.
    pub matched: bool,
    /// Why it made nothing: the criterion that failed, its cooldown, its rate, an error.
    pub reason: Option<String>,
    /// The execution it made.
    pub execution: Option<i64>,
}

/// An id for an event to record (`insert_event`): drawn before its transaction, so that what is
/// decided about it outside the transaction can name it.
pub async fn next_id(db: impl PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('event', 'id'))").fetch_one(db).await
}

/// Records event `id`; `false` when its delivery was recorded already (a redelivery).
pub async fn insert_event(
    db: impl PgExecutor<'_>,
    id: i64,
    trigger: &str,
    delivery: Option<&str>,
    payload: &Value,
    replay_of: Option<i64>,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO event (id, trigger, delivery, payload, replay_of) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (trigger, delivery) WHERE delivery IS NOT NULL DO NOTHING",
    )
    .bind(id)
    .bind(trigger)
    .bind(delivery)
    .bind(payload)
    .bind(replay_of)
    .execute(db)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// The event of `trigger` recorded for `delivery`.
pub async fn by_delivery(
    db: &mut PgConnection,
    trigger: &str,
    delivery: &str,
) -> Result<Option<ReceivedEvent>, sqlx::Error> {
    let id: Option<i64> = sqlx::query_scalar("SELECT id FROM event WHERE trigger = $1 AND delivery = $2")
        .bind(trigger)
        .bind(delivery)
        .fetch_optional(&mut *db)
        .await?;
    match id {
        Some(id) => get(db, id).await,
        None => Ok(None),
    }
}

pub async fn insert_match(db: impl PgExecutor<'_>, event: i64, rule: &str, answer: &Match) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO event_match (event, rule, matched, reason, execution) VALUES ($1, $2, $3, $4, $5)")
        .bind(event)
        .bind(rule)
        .bind(answer.matched)
        .bind(&answer.reason)
        .bind(answer.execution)
        .execute(db)
        .await?;
    Ok(())
}

/// Claims rule `rule`'s cooldown of `key` for `secs` from now: `Ok(None)` when claimed,
/// `Ok(Some(until))` when an earlier event holds it until then. A concurrent claim of the same
/// key waits for this transaction's end, and then finds it held.
pub async fn claim_cooldown(
    db: &mut PgConnection,
    rule: &str,
    key: &str,
    secs: u64,
    event: i64,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    let claimed: Option<i64> = sqlx::query_scalar(
        "INSERT INTO rule_cooldown (rule, key, until, event) VALUES ($1, $2, now() + make_interval(secs => $3), $4) \
         ON CONFLICT (rule, key) DO UPDATE SET until = EXCLUDED.until, event = EXCLUDED.event \
         WHERE rule_cooldown.until <= now() RETURNING event",
    )
    .bind(rule)
    .bind(key)
    .bind(secs as f64)
    .bind(event)
    .fetch_optional(&mut *db)
    .await?;
    if claimed.is_some() {
        return Ok(None);
    }
    sqlx::query_scalar("SELECT until FROM rule_cooldown WHERE rule = $1 AND key = $2")
        .bind(rule)
        .bind(key)
        .fetch_one(&mut *db)
        .await
        .map(Some)
}

/// Whether rule `rule` may make one more execution within its rate (`most` in any `secs`): the
/// rule's claims take turns (a lock until the transaction ends), each counting those before it.
pub async fn rate_room(db: &mut PgConnection, rule: &str, most: u32, secs: u64) -> Result<bool, sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(1635022967, hashtext($1))").bind(rule).execute(&mut *db).await?;
    let made: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM event_match WHERE rule = $1 AND execution IS NOT NULL \
         AND at > now() - make_interval(secs => $2)",
    )
    .bind(rule)
    .bind(secs as f64)
    .fetch_one(&mut *db)
    .await?;
    Ok(made < i64::from(most))
}

const EVENT: &str = "SELECT id, trigger, delivery, payload, received, replay_of FROM event";

pub async fn get(db: &mut PgConnection, id: i64) -> Result<Option<ReceivedEvent>, sqlx::Error> {
    let event: Option<ReceivedEvent> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("{EVENT} WHERE id = $1"))).bind(id).fetch_optional(&mut *db).await?;
    let Some(mut event) = event else { return Ok(None) };
    event.matches =
        sqlx::query_as("SELECT rule, matched, reason, execution FROM event_match WHERE event = $1 ORDER BY rule")
            .bind(id)
            .fetch_all(&mut *db)
            .await?;
    Ok(Some(event))
}

/// Events newest first (of `trigger`, before id `before`), at most `limit`, each with its matches.
pub async fn list(
    db: &mut PgConnection,
    trigger: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<ReceivedEvent>, sqlx::Error> {
    let mut events: Vec<ReceivedEvent> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{EVENT} WHERE ($1::text IS NULL OR trigger = $1) AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3"
    )))
    .bind(trigger)
    .bind(before)
    .bind(limit)
    .fetch_all(&mut *db)
    .await?;
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    #[derive(sqlx::FromRow)]
    struct Of {
        event: i64,
        #[sqlx(flatten)]
        answer: Match,
    }
    let matches: Vec<Of> = sqlx::query_as(
        "SELECT event, rule, matched, reason, execution FROM event_match WHERE event = ANY($1) ORDER BY event, rule",
    )
    .bind(&ids)
    .fetch_all(&mut *db)
    .await?;
    for Of { event, answer } in matches {
        if let Some(e) = events.iter_mut().find(|e| e.id == event) {
            e.matches.push(answer);
        }
    }
    Ok(events)
}

/// An event attune raised itself (`raise_event`, migration `20261208000000_own_events.sql`),
/// waiting for its rules' answers.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Raised {
    pub id: i64,
    pub trigger: String,
    pub payload: Value,
}

/// Claims the oldest raised event no other transaction holds, and takes it off the waiting list
/// (`event_pending`): the claim is the transaction's, so a rollback, or a connection lost, leaves
/// it waiting for the next look.
pub async fn claim_raised(tx: &mut PgConnection) -> Result<Option<Raised>, sqlx::Error> {
    sqlx::query_as(
        "WITH claimed AS ( \
             DELETE FROM event_pending WHERE event = \
                 (SELECT event FROM event_pending ORDER BY event LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING event) \
         SELECT e.id, e.trigger, e.payload FROM event e JOIN claimed c ON c.event = e.id",
    )
    .fetch_optional(tx)
    .await
}

/// The age in seconds of the oldest raised event waiting for an answer, if one waits (the gauge
/// `attune_oldest_event_waiting_seconds`).
pub async fn oldest_raised_waiting(db: impl PgExecutor<'_>) -> Result<Option<f64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - min(e.received))::float8 FROM event_pending p JOIN event e ON e.id = p.event",
    )
    .fetch_one(db)
    .await
}
