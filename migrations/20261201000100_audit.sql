-- The audit trail (issue 34): every change that a person asked for, one row per request that
-- could change state (whatever it was answered, a refusal included) and per change made from the
-- command line past the API (tokens). Append-only: no service may change a row; only the
-- executors' retention removes rows past `ATTUNE_RETENTION_AUDIT`.
CREATE TABLE audit_event (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- the API token that asked (null: not through the API), and its role then
    token_id BIGINT,
    role TEXT,
    -- who asked when no token did: 'cli:<user>' for the command line's database commands
    actor TEXT,
    -- the request: its method, its route as the OpenAPI document writes it, its path
    method TEXT NOT NULL,
    route TEXT NOT NULL,
    path TEXT NOT NULL,
    -- the HTTP status it was answered (0: not an HTTP request)
    status SMALLINT NOT NULL,
    -- what it made or changed, when the path does not say: 'execution:42', 'token:7'
    target TEXT,
    -- the `X-Attune-Reason` header (the CLI's --reason)
    reason TEXT,
    CONSTRAINT audit_event_who CHECK (token_id IS NOT NULL OR actor IS NOT NULL)
);
CREATE INDEX audit_event_at_idx ON audit_event (at);
CREATE INDEX audit_event_token_idx ON audit_event (token_id, id) WHERE token_id IS NOT NULL;

-- (the archive keeps the table's columns, in its order, for `ATTUNE_RETENTION_ARCHIVE`)
CREATE TABLE audit_event_archive (LIKE audit_event);

CREATE FUNCTION audit_event_unchanged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % is refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR TRUNCATE ON audit_event
    FOR EACH STATEMENT EXECUTE FUNCTION audit_event_unchanged();

-- The default privileges gave the API and the executors every right: the API writes and reads
-- events, the executors read them and remove those past their age, workers nothing.
REVOKE ALL ON audit_event, audit_event_archive FROM attune_api, attune_executor;
GRANT SELECT, INSERT ON audit_event TO attune_api;
GRANT SELECT, DELETE ON audit_event TO attune_executor;
GRANT INSERT ON audit_event_archive TO attune_executor;
