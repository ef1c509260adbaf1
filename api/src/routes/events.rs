//! Events in (ADR 0013): `POST /api/v1/webhooks/{name}` takes a delivery (proven by the
//! webhook's own token or the sender's signature, not an API token), records it as an event and,
//! in the same transaction, what every rule of its trigger made of it: the criterion that failed,
//! the cooldown or rate that held it, or the execution it made. The sender is answered `2xx` only
//! once that is committed; a redelivery (the same delivery id) is answered as the first delivery
//! was and makes nothing more. Admins set a webhook's credential; anyone with a token reads the
//! webhooks, the rules and the events, and operators replay an event.

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use attune_common::db::{self, events::Match, events::ReceivedEvent, events::Rule, events::WebhookInfo};
use attune_common::metrics::{self, EVENTS_DEDUPLICATED, EVENTS_RECEIVED, RULE_ANSWERS};
use attune_common::secrets::{from_hex, to_hex};
use attune_core::params;
use attune_core::rules::{self, Decision, WebhookAuth};

use crate::ApiError;
use crate::audit::Target;
use crate::routes::executions::CreateExecution;

/// The delivery route, which the API token layer leaves to the webhook's own proof.
pub const DELIVERY_PATH: &str = "/api/v1/webhooks/{name}";
/// How far a Stripe signature's time may be from now.
const STRIPE_TOLERANCE_SECS: i64 = 300;

/// What a delivery (or a replay) came to.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Recorded {
    /// The event's id (the first delivery's, for a redelivery).
    pub event: i64,
    /// The delivery id was recorded already: nothing more was made.
    pub duplicate: bool,
    /// Each rule of the trigger and what it made of the event.
    pub matches: Vec<Match>,
}

#[utoipa::path(post, path = "/api/v1/webhooks/{name}", operation_id = "deliver_webhook", tag = "events",
    security(()),
    params(("name" = String, Path, description = "The webhook's name")),
    request_body(content = Object, description = "The sender's JSON payload"),
    responses(
        (status = 202, description = "Recorded as an event, with what each rule made of it", body = Recorded),
        (status = 200, description = "A redelivery: answered as the first delivery was", body = Recorded),
        (status = 400, description = "The body is not JSON; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 401, description = "The token or signature does not prove the sender", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such webhook", body = crate::openapi::ErrorBody),
        (status = 413, description = "The body is larger than the webhook takes", body = crate::openapi::ErrorBody),
        (status = 503, description = "The webhook has no credential set yet", body = crate::openapi::ErrorBody),
    ))]
pub async fn deliver(
    State(state): State<crate::State>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<Recorded>), ApiError> {
    let Path(name) = name?;
    let body = body?;
    let webhook = db::events::webhook(&state.db, &name)
        .await?
        .ok_or_else(|| ApiError::not_found("webhook", format!("no webhook '{name}'")))?;
    if body.len() > usize::try_from(webhook.max_bytes).unwrap_or(usize::MAX) {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("webhook '{name}' takes at most {} bytes; this body is {}", webhook.max_bytes, body.len()),
        ));
    }
    let auth = auth_of(&webhook)?;
    prove(&state, &webhook, auth, &headers, &body)?;
    let payload: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(Some("body"), format!("the body is not JSON: {e}")))?;
    crate::error::storable_json("body", &payload)?;
    let delivery = delivery_id(auth, &headers, &payload)?;
    let trigger = format!("webhook.{name}");
    let recorded = record(&state, &trigger, delivery.as_deref(), &payload, None).await?;
    let status = if recorded.duplicate { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(recorded)))
}

/// The kind of proof webhook `webhook` takes, as stored.
fn auth_of(webhook: &db::events::Webhook) -> Result<WebhookAuth, ApiError> {
    serde_json::from_value(json!(webhook.auth))
        .map_err(|e| ApiError::internal("a webhook's stored kind of proof is unreadable", e))
}

/// The sender's proof: the webhook's token, or its signature over the body.
fn prove(
    state: &crate::AppState,
    webhook: &db::events::Webhook,
    auth: WebhookAuth,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), ApiError> {
    let unset = || {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "webhook_without_credential",
            format!(
                "webhook '{}' has no credential yet: an admin sets it (attune webhook credential {})",
                webhook.name, webhook.name
            ),
        )
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let refused = |what: &str| ApiError::unauthorized(format!("webhook '{}': {what}", webhook.name));
    if auth == WebhookAuth::Token {
        let stored = webhook.token_sha256.as_deref().ok_or_else(unset)?;
        let given = header("x-attune-webhook-token")
            .or_else(|| header("authorization").and_then(|v| v.strip_prefix("Bearer ")))
            .ok_or_else(|| refused("no token (X-Attune-Webhook-Token, or Authorization: Bearer)"))?;
        let digest = to_hex(&db::token::hash(given));
        return if same(digest.as_bytes(), stored.as_bytes()) {
            Ok(())
        } else {
            Err(refused("the token is not this webhook's"))
        };
    }
    let sealed = webhook.signing_key.as_deref().ok_or_else(unset)?;
    let sealer = state.settings.sealer.as_ref().ok_or_else(|| {
        ApiError::unavailable("the API has no secrets key (ATTUNE_SECRETS_KEY_FILE): it cannot check signatures")
    })?;
    let key = sealer.open(&format!("webhook:{}", webhook.name), sealed).map_err(|_| {
        ApiError::unavailable(format!("webhook '{}': its key does not open with the API's key", webhook.name))
    })?;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
    let check = |signed: &[u8], hex_tag: &str| {
        from_hex(hex_tag).is_some_and(|tag| ring::hmac::verify(&key, signed, &tag).is_ok())
    };
    let proven = match auth {
        WebhookAuth::Github => header("x-hub-signature-256")
            .and_then(|v| v.strip_prefix("sha256="))
            .ok_or_else(|| refused("no X-Hub-Signature-256: sha256=…"))
            .map(|tag| check(body, tag))?,
        WebhookAuth::Hmac => header("x-signature")
            .map(|v| v.strip_prefix("sha256=").unwrap_or(v))
            .ok_or_else(|| refused("no X-Signature"))
            .map(|tag| check(body, tag))?,
        WebhookAuth::Stripe => {
            let given = header("stripe-signature").ok_or_else(|| refused("no Stripe-Signature"))?;
            let parts: Vec<(&str, &str)> = given.split(',').filter_map(|p| p.trim().split_once('=')).collect();
            let part = |key: &str| parts.iter().filter(|(k, _)| *k == key).map(|(_, v)| *v).collect::<Vec<_>>();
            let at = part("t")
                .first()
                .and_then(|t| t.parse::<i64>().ok())
                .ok_or_else(|| refused("no t= in Stripe-Signature"))?;
            if (chrono::Utc::now().timestamp() - at).abs() > STRIPE_TOLERANCE_SECS {
                return Err(refused("the Stripe-Signature's time is more than 5 minutes from now"));
            }
            let signed = [at.to_string().as_bytes(), b".", body].concat();
            part("v1").into_iter().any(|tag| check(&signed, tag))
        }
        WebhookAuth::Token => unreachable!("handled above"),
    };
    if proven { Ok(()) } else { Err(refused("the signature does not match the body")) }
}

/// The sender's delivery id: GitHub's `X-GitHub-Delivery`, a Stripe event's `id`, else
/// `X-Delivery-Id` or `Idempotency-Key`.
fn delivery_id(auth: WebhookAuth, headers: &HeaderMap, payload: &Value) -> Result<Option<String>, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_string());
    let id = match auth {
        WebhookAuth::Github => header("x-github-delivery"),
        WebhookAuth::Stripe => payload.get("id").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
    .or_else(|| header("x-delivery-id"))
    .or_else(|| header("idempotency-key"))
    .filter(|id| !id.is_empty());
    if let Some(id) = &id {
        if id.len() > 255 {
            return Err(ApiError::invalid("X-Delivery-Id", "a delivery id is at most 255 bytes"));
        }
        crate::error::storable("X-Delivery-Id", id)?;
    }
    Ok(id)
}

/// Records an event of `trigger` and what each enabled rule of it makes of it, in one
/// transaction; a delivery recorded already is answered as it was.
///
/// Everything that reads from the pool (the rules, each matching rule's submission checks, which
/// read the action and the secrets' users) is done before the transaction opens: a transaction
/// that waited for a second connection of the pool while holding one starved it under a burst
/// (50 deliveries at once held 16 connections, each waiting for a 17th, for the pool's 10 s).
/// What the transaction does is the event's row, the cooldowns and rates, the executions and
/// the matches, on its own connection.
pub(crate) async fn record(
    state: &crate::AppState,
    trigger: &str,
    delivery: Option<&str>,
    payload: &Value,
    replay_of: Option<i64>,
) -> Result<Recorded, ApiError> {
    // (a redelivery, most often, is answered without planning anything)
    if let Some(delivery) = delivery {
        let mut conn = state.db.acquire().await?;
        if let Some(first) = db::events::by_delivery(&mut conn, trigger, delivery).await? {
            metrics::increment(&EVENTS_DEDUPLICATED, &[], 1);
            return Ok(Recorded { event: first.id, duplicate: true, matches: first.matches });
        }
    }
    let event = db::events::next_id(&state.db).await?;
    let answers = plan_rules(state, event, trigger, payload).await?;
    let mut tx = state.db.begin().await?;
    if !db::events::insert_event(&mut *tx, event, trigger, delivery, payload, replay_of).await? {
        // a redelivery that raced the first: answered as it was
        let first = db::events::by_delivery(&mut tx, trigger, delivery.unwrap_or_default())
            .await?
            .ok_or_else(|| ApiError::unavailable("a delivery's first event is not visible yet; send it again"))?;
        tx.commit().await?;
        metrics::increment(&EVENTS_DEDUPLICATED, &[], 1);
        return Ok(Recorded { event: first.id, duplicate: true, matches: first.matches });
    }
    let matches = carry_out_rules(&mut tx, event, answers).await?;
    tx.commit().await?;
    metrics::increment(&EVENTS_RECEIVED, &[], 1);
    Ok(Recorded { event, duplicate: false, matches })
}

/// What every enabled rule of `trigger` makes of event `event`, as far as it can be decided
/// before the event's transaction (reading from the pool, for each matching rule, what a
/// submission reads).
pub(crate) async fn plan_rules(
    state: &crate::AppState,
    event: i64,
    trigger: &str,
    payload: &Value,
) -> Result<Vec<(String, Planned)>, ApiError> {
    let scope = rules::scope(event, trigger, payload);
    let mut answers = Vec::new();
    for (rule_ref, spec) in db::events::rules_of(&state.db, trigger).await? {
        let answer = plan(state, event, trigger, &rule_ref, &spec, &scope).await?;
        answers.push((rule_ref, answer));
    }
    Ok(answers)
}

/// The planned answers carried out in the event's transaction, each recorded as its match.
pub(crate) async fn carry_out_rules(
    tx: &mut sqlx::PgConnection,
    event: i64,
    answers: Vec<(String, Planned)>,
) -> Result<Vec<Match>, ApiError> {
    let mut matches = Vec::new();
    for (rule_ref, answer) in answers {
        let (answer, outcome) = carry_out(&mut *tx, event, &rule_ref, answer).await?;
        metrics::increment(&RULE_ANSWERS, &[("outcome", outcome)], 1);
        db::events::insert_match(&mut *tx, event, &rule_ref, &answer).await?;
        matches.push(answer);
    }
    Ok(matches)
}

/// A rule's answer before the event's transaction: made already (no match, an error), or an
/// execution to make unless its rate or cooldown holds it.
pub(crate) enum Planned {
    Answered(Match, &'static str),
    Run { new: Box<db::execution::NewExecution>, cooldown: Option<(String, u64)>, rate: Option<(u32, u64)> },
}

/// What rule `rule_ref` makes of event `event`, as far as it can be decided outside the event's
/// transaction (the outcome as `attune_rule_answers_total` counts it).
async fn plan(
    state: &crate::AppState,
    event: i64,
    trigger: &str,
    rule_ref: &str,
    spec: &rules::RuleSpec,
    scope: &Value,
) -> Result<Planned, ApiError> {
    let answered = |matched: bool, reason: String, outcome: &'static str| {
        Planned::Answered(Match { rule: rule_ref.to_string(), matched, reason: Some(reason), execution: None }, outcome)
    };
    let (parameters, cooldown, rate) = match rules::evaluate(spec, scope) {
        Decision::NoMatch { reason } => return Ok(answered(false, reason, "not_matched")),
        Decision::Error { reason } => return Ok(answered(true, reason, "error")),
        Decision::Run { parameters, cooldown, rate } => (parameters, cooldown, rate),
    };
    // a stored secret the rule names must be there: a rule's answer says so now, where the
    // execution would only fail when a worker opens it
    let named: Vec<(String, String)> = parameters
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, value)| params::secret_reference(value).map(|s| (name.clone(), s.to_string())))
        .collect();
    let names: Vec<String> = named.iter().map(|(_, secret)| secret.clone()).collect();
    let missing = db::secret::missing(&state.db, &names).await?;
    if let Some((parameter, secret)) = named.iter().find(|(_, secret)| missing.contains(secret)) {
        let reason = format!(
            "not run: parameter '{parameter}' names the secret '{secret}', which is not stored \
             (an admin sets it: attune secret set {secret} --users {})",
            spec.action
        );
        return Ok(answered(true, reason, "error"));
    }
    // the checks of a submission, as if an operator had sent it
    let request = CreateExecution {
        action_ref: spec.action.clone(),
        parameters: Some(parameters),
        // (`trigger` marks what answers attune's own events: it raises none itself)
        config: Some(json!({"rule": rule_ref, "event": event, "trigger": trigger})),
    };
    match crate::routes::executions::plan(state, request).await {
        Ok(new) => Ok(Planned::Run { new: Box::new(new), cooldown, rate }),
        Err(e) if e.status.is_client_error() => Ok(answered(true, format!("not run: {}", e.message), "error")),
        Err(e) => Err(e),
    }
}

/// A planned answer carried out in the event's transaction: the rate, the cooldown, the execution.
async fn carry_out(
    tx: &mut sqlx::PgConnection,
    event: i64,
    rule_ref: &str,
    planned: Planned,
) -> Result<(Match, &'static str), ApiError> {
    let (new, cooldown, rate) = match planned {
        Planned::Answered(answer, outcome) => return Ok((answer, outcome)),
        Planned::Run { new, cooldown, rate } => (new, cooldown, rate),
    };
    let held = |reason: String| {
        (Match { rule: rule_ref.to_string(), matched: true, reason: Some(reason), execution: None }, "held")
    };
    if let Some((most, secs)) = rate
        && !db::events::rate_room(&mut *tx, rule_ref, most, secs).await?
    {
        return Ok(held(format!("held by its rate: {most} executions in {secs} s made already")));
    }
    if let Some((key, secs)) = cooldown
        && let Some(until) = db::events::claim_cooldown(&mut *tx, rule_ref, &key, secs, event).await?
    {
        return Ok(held(format!("held by its cooldown of '{key}' until {}", until.to_rfc3339())));
    }
    let execution = db::execution::insert_submitted(&mut *tx, &new, None).await?;
    Ok((Match { rule: rule_ref.to_string(), matched: true, reason: None, execution: Some(execution.id) }, "matched"))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetCredential {
    /// A signing key (github, stripe, hmac: 16 to 4096 characters), or a token of your own
    /// (token: 24 to 4096 characters); without it, a token webhook gets a new random token.
    #[schema(min_length = 16, max_length = 4096, pattern = r"^[^\x00]*$")]
    pub value: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CredentialSet {
    pub webhook: WebhookInfo,
    /// The token made (shown once: only its hash is kept); null when one was given.
    pub token: Option<String>,
}

#[utoipa::path(put, path = "/webhooks/{name}/credential", operation_id = "set_webhook_credential", tag = "events",
    params(("name" = String, Path, description = "The webhook's name")),
    request_body = SetCredential,
    responses(
        (status = 200, description = "Set: the webhook takes deliveries proven by it", body = CredentialSet),
        (status = 404, description = "No such webhook", body = crate::openapi::ErrorBody),
        (status = 422, description = "The value is missing or of the wrong length; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 503, description = "A signing key needs the API's secrets key", body = crate::openapi::ErrorBody),
    ))]
pub async fn set_credential(
    State(state): State<crate::State>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<SetCredential>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<CredentialSet>, ApiError> {
    let Path(name) = name?;
    let Json(body) = body?;
    let webhook = db::events::webhook(&state.db, &name)
        .await?
        .ok_or_else(|| ApiError::not_found("webhook", format!("no webhook '{name}'")))?;
    let auth = auth_of(&webhook)?;
    if let Some(value) = &body.value {
        let least = if auth.signs() { 16 } else { 24 };
        if value.chars().count() < least || value.chars().count() > 4096 {
            return Err(ApiError::invalid("value", format!("'value' is {least} to 4096 characters")));
        }
        crate::error::storable("value", value)?;
    }
    let (made, set) = if auth.signs() {
        let value = body.value.ok_or_else(|| {
            ApiError::invalid("value", format!("a {} webhook needs its signing key as 'value'", auth.as_str()))
        })?;
        let sealer = state.settings.sealer.as_ref().ok_or_else(|| {
            ApiError::unavailable("the API has no secrets key (ATTUNE_SECRETS_KEY_FILE): it cannot keep a signing key")
        })?;
        let sealed = sealer.seal(&format!("webhook:{name}"), &value);
        (None, db::events::set_credential(&state.db, &name, None, Some(&sealed)).await?)
    } else {
        // (a token the caller chose is not answered back)
        let (token, made) = match body.value {
            Some(given) => (given, false),
            None => (format!("awh_{}", to_hex(&random_bytes()?)), true),
        };
        let digest = to_hex(&db::token::hash(&token));
        (made.then_some(token), db::events::set_credential(&state.db, &name, Some(&digest), None).await?)
    };
    let webhook = set.ok_or_else(|| ApiError::not_found("webhook", format!("no webhook '{name}'")))?;
    Ok(Json(CredentialSet { webhook, token: made }))
}

fn random_bytes() -> Result<[u8; 24], ApiError> {
    let mut bytes = [0u8; 24];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| ApiError::internal("the system's random source failed", "ring::rand"))?;
    Ok(bytes)
}

#[utoipa::path(get, path = "/webhooks", operation_id = "list_webhooks", tag = "events",
    responses((status = 200, description = "Every webhook, and whether its credential is set", body = Vec<WebhookInfo>)))]
pub async fn list_webhooks(State(state): State<crate::State>) -> Result<Json<Vec<WebhookInfo>>, ApiError> {
    Ok(Json(db::events::webhooks(&state.db).await?))
}

#[utoipa::path(get, path = "/rules", operation_id = "list_rules", tag = "events",
    responses((status = 200, description = "Every rule, with its file as loaded", body = Vec<Rule>)))]
pub async fn list_rules(State(state): State<crate::State>) -> Result<Json<Vec<Rule>>, ApiError> {
    Ok(Json(db::events::rules(&state.db).await?))
}

#[utoipa::path(post, path = "/rules", operation_id = "create_rule", tag = "events",
    request_body(content = rules::RuleSpec, description = "A rule as a pack's `rules/NAME.yaml` writes it, as JSON; it becomes `local.NAME`"),
    responses(
        (status = 201, description = "Made: it answers its trigger's events from now on", body = Rule),
        (status = 409, description = "A rule `local.NAME` exists", body = crate::openapi::ErrorBody),
        (status = 422, description = "A field is invalid, or its action does not exist; `parameter` names it", body = crate::openapi::ErrorBody),
    ))]
pub async fn create_rule(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    crate::error::JsonObject(spec): crate::error::JsonObject<rules::RuleSpec>,
) -> Result<(StatusCode, Extension<Target>, Json<Rule>), ApiError> {
    rules::check_rule(&spec).map_err(|(field, reason)| ApiError::invalid(&field, reason))?;
    let definition = serde_json::to_value(&spec).map_err(|e| ApiError::internal("a rule serializes", e))?;
    crate::error::storable_json("rule", &definition)?;
    if db::action::get_by_ref(&state.db, &spec.action).await?.is_none() {
        return Err(ApiError::invalid("action", format!("no action '{}' is registered", spec.action)));
    }
    let rule_ref = format!("{}.{}", db::events::LOCAL_PACK, spec.name);
    let made = db::events::create_rule(&state.db, &spec, caller.token_id).await?.ok_or_else(|| {
        ApiError::new(StatusCode::CONFLICT, "rule_exists", format!("rule '{rule_ref}' exists (delete it first)"))
    })?;
    Ok((StatusCode::CREATED, Extension(Target::new(format!("rule:{rule_ref}"))), Json(made)))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetEnabled {
    pub enabled: bool,
}

#[utoipa::path(put, path = "/rules/{ref}/enabled", operation_id = "set_rule_enabled", tag = "events",
    params(("ref" = String, Path, description = "The rule's ref, `pack.name`")),
    request_body = SetEnabled,
    responses(
        (status = 200, description = "Enabled or disabled; a pack's registration keeps it so", body = Rule),
        (status = 404, description = "No such rule", body = crate::openapi::ErrorBody),
        (status = 422, description = "`enabled` is missing or not a boolean", body = crate::openapi::ErrorBody),
    ))]
pub async fn set_rule_enabled(
    State(state): State<crate::State>,
    Extension(caller): Extension<crate::auth::Caller>,
    rule_ref: Result<Path<String>, PathRejection>,
    crate::error::JsonObject(body): crate::error::JsonObject<SetEnabled>,
) -> Result<(Extension<Target>, Json<Rule>), ApiError> {
    let Path(rule_ref) = rule_ref?;
    let rule = db::events::set_enabled(&state.db, &rule_ref, body.enabled, caller.token_id)
        .await?
        .ok_or_else(|| ApiError::not_found("rule", format!("no rule '{rule_ref}'")))?;
    Ok((Extension(Target::new(format!("rule:{rule_ref}"))), Json(rule)))
}

#[utoipa::path(delete, path = "/rules/{ref}", operation_id = "delete_rule", tag = "events",
    params(("ref" = String, Path, description = "The rule's ref, `local.name`")),
    responses(
        (status = 204, description = "Deleted: its events keep their answers"),
        (status = 404, description = "No such rule", body = crate::openapi::ErrorBody),
        (status = 409, description = "The rule is a pack's file's: disable it, or remove it from its pack", body = crate::openapi::ErrorBody),
    ))]
pub async fn delete_rule(
    State(state): State<crate::State>,
    rule_ref: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Extension<Target>), ApiError> {
    let Path(rule_ref) = rule_ref?;
    if !db::events::delete_made_rule(&state.db, &rule_ref).await? {
        return Err(match db::events::rule(&state.db, &rule_ref).await? {
            Some(rule) => ApiError::new(
                StatusCode::CONFLICT,
                "rule_of_a_pack",
                format!(
                    "rule '{rule_ref}' comes from pack {}'s rules/ (disable it: PUT /api/v1/rules/{rule_ref}/enabled)",
                    rule.pack
                ),
            ),
            None => ApiError::not_found("rule", format!("no rule '{rule_ref}'")),
        });
    }
    Ok((StatusCode::NO_CONTENT, Extension(Target::new(format!("rule:{rule_ref}")))))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventQuery {
    /// Events of this trigger (`webhook.NAME`)
    #[param(min_length = 1, max_length = 255)]
    pub trigger: Option<String>,
    /// Events with ids below this one (the last id of the page before)
    pub before: Option<i64>,
    /// At most this many (1 to 500; 50 by default)
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

#[utoipa::path(get, path = "/events", operation_id = "list_events", tag = "events", params(EventQuery),
    responses(
        (status = 200, description = "Events, newest first, each with what every rule made of it", body = Vec<ReceivedEvent>),
        (status = 422, description = "A filter is invalid; `parameter` names it", body = crate::openapi::ErrorBody),
    ))]
pub async fn list_events(
    State(state): State<crate::State>,
    query: Result<Query<EventQuery>, QueryRejection>,
) -> Result<Json<Vec<ReceivedEvent>>, ApiError> {
    let Query(query) = query?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("limit", "'limit' must be between 1 and 500"));
    }
    if let Some(trigger) = &query.trigger {
        if trigger.is_empty() || trigger.chars().count() > 255 {
            return Err(ApiError::invalid("trigger", "'trigger' must be 1 to 255 characters (webhook.NAME)"));
        }
        crate::error::storable("trigger", trigger)?;
    }
    let mut conn = state.db.acquire().await?;
    Ok(Json(db::events::list(&mut conn, query.trigger.as_deref(), query.before, limit).await?))
}

#[utoipa::path(get, path = "/events/{id}", operation_id = "get_event", tag = "events",
    params(("id" = i64, Path, description = "The event's id")),
    responses(
        (status = 200, description = "The event and what every rule made of it", body = ReceivedEvent),
        (status = 400, description = "The id is not an integer; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such event", body = crate::openapi::ErrorBody),
    ))]
pub async fn get_event(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<ReceivedEvent>, ApiError> {
    let Path(id) = id?;
    let mut conn = state.db.acquire().await?;
    let event = db::events::get(&mut conn, id).await?;
    Ok(Json(event.ok_or_else(|| ApiError::not_found("event", format!("no event {id}")))?))
}

#[utoipa::path(post, path = "/events/{id}/replay", operation_id = "replay_event", tag = "events",
    params(("id" = i64, Path, description = "The event to replay")),
    responses(
        (status = 202, description = "Its payload recorded again as a new event (`replay_of`), with the rules' answers now", body = Recorded),
        (status = 400, description = "The id is not an integer; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such event", body = crate::openapi::ErrorBody),
    ))]
pub async fn replay(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<(StatusCode, Json<Recorded>), ApiError> {
    let Path(id) = id?;
    let mut conn = state.db.acquire().await?;
    let event =
        db::events::get(&mut conn, id).await?.ok_or_else(|| ApiError::not_found("event", format!("no event {id}")))?;
    drop(conn);
    let recorded = record(&state, &event.trigger, None, &event.payload, Some(id)).await?;
    Ok((StatusCode::ACCEPTED, Json(recorded)))
}

/// Whether `a` and `b` are equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |differ, (x, y)| differ | (x ^ y)) == 0
}
