-- Roles (issue 15, least privilege). A token's role says what it may call: `read` every GET under
-- /api/v1 but the token list; `operator` also submits, retries, cancels and fails executions;
-- `admin` also registers packs and manages tokens. The API enforces it in one table
-- (api/src/roles.rs). The default is `admin` so that every token made before this migration keeps
-- working as it did, and so does one made through the database without a role; narrower tokens
-- are made with `attune token create --role read|operator`.
ALTER TABLE api_token
    ADD COLUMN role TEXT NOT NULL DEFAULT 'admin'
        CONSTRAINT api_token_role_known CHECK (role IN ('read', 'operator', 'admin')),
    -- when the token stops working (the API answers 401 "token expired"); NULL: never
    ADD COLUMN expires TIMESTAMPTZ;

-- Who asked, by API token (api_token.id; tokens are revoked, never deleted). `submitted_by`: the
-- token that submitted the execution; for a manual retry, the token that asked for the retry; an
-- automatic retry keeps its parent's (the chain runs on its submitter's behalf; `retry_reason`
-- tells a manual retry from the system's). NULL when no token asked: rows from before this
-- migration, or made in the database directly. `ended_by`: the token that ended it by hand, with
-- a cancel or an operator's fail (`failure_kind` canceled or operator_failed tells which); NULL
-- when it ended by itself. The foreign keys are NOT VALID: checked for every new row, without a
-- scan of the whole table under the ALTER's lock.
ALTER TABLE execution
    ADD COLUMN submitted_by BIGINT,
    ADD COLUMN ended_by BIGINT,
    ADD CONSTRAINT execution_submitted_by_fkey FOREIGN KEY (submitted_by) REFERENCES api_token (id) NOT VALID,
    ADD CONSTRAINT execution_ended_by_fkey FOREIGN KEY (ended_by) REFERENCES api_token (id) NOT VALID;
