-- Events in (issue 49, ADR 0013): webhooks, rules, the events they receive and what each rule
-- made of each event.
--
-- * A webhook (a pack's `webhooks/NAME.yaml`) takes deliveries at `POST /api/v1/webhooks/NAME`,
--   proven by a token of its own (kept as its SHA-256) or a signature whose key the API sealed
--   (`credential`): both are set by an admin, never by the pack.
-- * A rule (a pack's `rules/NAME.yaml`, `pack.name`) turns an event of its trigger
--   (`webhook.NAME`) that meets its criteria into an execution of its action.
-- * An event is committed with every rule's answer (`event_match`) and the executions they made
--   in one transaction, before the sender is answered `2xx`. A sender's delivery id makes a
--   redelivery the same event (`event_delivery_once`): it is answered as the first was and makes
--   nothing more.
-- * A rule's cooldown holds one row per key (`rule_cooldown`) whose `until` the first event of a
--   key claims; a concurrent event of the same key waits for that row and finds it claimed.

CREATE TABLE webhook (
    name TEXT PRIMARY KEY CONSTRAINT webhook_name_form CHECK (name ~ '^[A-Za-z0-9_-]{1,128}$'),
    pack TEXT NOT NULL,
    auth TEXT NOT NULL CONSTRAINT webhook_auth_kind CHECK (auth IN ('token', 'github', 'stripe', 'hmac')),
    max_bytes INTEGER NOT NULL CHECK (max_bytes BETWEEN 1 AND 16777216),
    description TEXT,
    -- a token's SHA-256 (hex), or a signing key sealed by the API for `webhook:NAME`
    token_sha256 TEXT,
    signing_key BYTEA,
    credential_set TIMESTAMPTZ,
    created TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE rule (
    ref TEXT PRIMARY KEY,
    pack TEXT NOT NULL,
    trigger TEXT NOT NULL,
    action_ref TEXT NOT NULL,
    enabled BOOLEAN NOT NULL DEFAULT true,
    -- the file as loaded (`attune_core::rules::RuleSpec`)
    definition JSONB NOT NULL,
    created TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX rule_by_trigger ON rule (trigger) WHERE enabled;

CREATE TABLE event (
    id BIGSERIAL PRIMARY KEY,
    trigger TEXT NOT NULL,
    -- the sender's delivery id, when it gave one
    delivery TEXT CHECK (length(delivery) <= 255),
    payload JSONB NOT NULL,
    received TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- the event this one replays (by hand): its payload again, its own matches
    replay_of BIGINT REFERENCES event (id) ON DELETE SET NULL
);
CREATE UNIQUE INDEX event_delivery_once ON event (trigger, delivery) WHERE delivery IS NOT NULL;
CREATE INDEX event_by_received ON event (received DESC, id DESC);

CREATE TABLE event_match (
    event BIGINT NOT NULL REFERENCES event (id) ON DELETE CASCADE,
    rule TEXT NOT NULL,
    -- whether its criteria held
    matched BOOLEAN NOT NULL,
    -- why it made nothing: the criterion that failed, the cooldown, the rate, an error
    reason TEXT,
    execution BIGINT,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (event, rule)
);
CREATE INDEX event_match_made ON event_match (rule, at) WHERE execution IS NOT NULL;
CREATE INDEX event_match_by_execution ON event_match (execution) WHERE execution IS NOT NULL;

CREATE TABLE rule_cooldown (
    rule TEXT NOT NULL,
    key TEXT NOT NULL,
    until TIMESTAMPTZ NOT NULL,
    event BIGINT,
    PRIMARY KEY (rule, key)
);

-- The API receives and registers; the executors read (they will raise attune's own events).
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON webhook, rule, event, event_match, rule_cooldown FROM attune_executor;
GRANT SELECT ON webhook, rule, event, event_match TO attune_executor;
REVOKE TRUNCATE ON webhook, rule, event, event_match, rule_cooldown FROM attune_api;
-- an event is history: the API adds to it and never rewrites it
REVOKE UPDATE, DELETE ON event, event_match FROM attune_api;
