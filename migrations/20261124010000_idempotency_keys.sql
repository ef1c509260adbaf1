-- `Idempotency-Key` on POST /api/v1/executions: for 24 hours, a key a token has sent names the
-- execution its first request created, so that a client retrying the same request gets that
-- execution back instead of a second one (common/src/db/idempotency.rs).
CREATE TABLE api_idempotency_key (
    -- keys are scoped per API token: two clients choosing the same key do not collide
    token          BIGINT NOT NULL REFERENCES api_token(id) ON DELETE CASCADE,
    -- the header's value: 1 to 255 visible ASCII characters (the API refuses others with a 400)
    key            TEXT NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the canonical JSON of the parsed request body: the same key with another body
    -- is refused (409), whatever the whitespace or the order of the keys
    request_sha256 BYTEA NOT NULL CHECK (octet_length(request_sha256) = 32),
    -- inserted in the same transaction as this row, so a committed key always names one
    execution      BIGINT NOT NULL REFERENCES execution(id) ON DELETE CASCADE,
    -- a row older than 24 hours is expired: the key is free again, and the row is replaced on
    -- reuse or deleted by the cleanup a later keyed submission does
    created        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (token, key)
);
-- the cleanup deletes the oldest expired rows first
CREATE INDEX api_idempotency_key_created_idx ON api_idempotency_key (created);
