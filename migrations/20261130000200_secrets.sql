-- The secret store (attune_common::secrets): each value sealed with the operator's key
-- (ATTUNE_SECRETS_KEY_FILE) before it is written; nobody reads it back through attune.
CREATE TABLE secret (
    name       TEXT PRIMARY KEY CONSTRAINT secret_name_form CHECK (name ~ '^[A-Za-z0-9_.-]{1,128}$'),
    sealed     BYTEA NOT NULL,
    created    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by BIGINT REFERENCES api_token(id)
);
-- the API sets and lists them, the workers open what they run with; the executors never see them
REVOKE ALL ON secret FROM attune_executor;
GRANT SELECT ON secret TO attune_worker;
