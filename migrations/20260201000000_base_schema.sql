-- attune base schema: packs, actions, workers, executions and API tokens.
-- The retry and health columns, the healthy_workers view and the helper functions
-- follow in 20260209000000_phase3_retry_and_health.sql.

CREATE TYPE execution_status AS ENUM (
    'requested',   -- written by the API; a request message is (being) published
    'scheduling',  -- claimed by an executor that is choosing a worker
    'scheduled',   -- dispatched to one worker's queue
    'running',     -- the worker started the action's process
    'completed',
    'failed',
    'timeout',     -- the action exceeded its own timeout_seconds
    'canceled',
    'abandoned',   -- was running on a worker that vanished and is not retried automatically
    'delayed'      -- a retry waiting out its backoff (not_before); becomes requested when due
);

CREATE TABLE pack (
    id          BIGSERIAL PRIMARY KEY,
    ref         TEXT NOT NULL UNIQUE,
    version     TEXT NOT NULL,
    description TEXT,
    -- directory the pack was registered from, as the workers see it
    path        TEXT,
    created     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE action (
    id          BIGSERIAL PRIMARY KEY,
    -- 'pack.name'
    ref         TEXT NOT NULL UNIQUE,
    pack        BIGINT NOT NULL REFERENCES pack(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    description TEXT,
    runtime     TEXT NOT NULL,
    -- relative to the pack's directory
    entrypoint  TEXT NOT NULL,
    -- declared parameters: {"name": {"type": ..., "required": ..., "default": ...}}
    parameters  JSONB NOT NULL DEFAULT '{}',
    created     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE worker (
    id             BIGSERIAL PRIMARY KEY,
    name           TEXT NOT NULL UNIQUE,
    status         TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    -- {"runtimes": [...], "concurrency": n, "health": {...}} as reported on every heartbeat
    capabilities   JSONB NOT NULL DEFAULT '{}',
    last_heartbeat TIMESTAMPTZ,
    created        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated        TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE execution (
    id           BIGSERIAL PRIMARY KEY,
    action       BIGINT REFERENCES action(id) ON DELETE SET NULL,
    action_ref   TEXT NOT NULL,
    parameters   JSONB NOT NULL DEFAULT '{}',
    config       JSONB NOT NULL DEFAULT '{}',
    status       execution_status NOT NULL DEFAULT 'requested',
    -- the worker the execution was dispatched to (set with status 'scheduled')
    worker       BIGINT REFERENCES worker(id) ON DELETE SET NULL,
    result       JSONB,
    -- structured failure kind (see docs/state-machine.md); never derived from message text
    failure_kind TEXT,
    error        TEXT,
    exit_code    INTEGER,
    -- bounded by the worker (tail kept)
    stdout       TEXT,
    stderr       TEXT,
    started      TIMESTAMPTZ,
    finished     TIMESTAMPTZ,
    created      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- finished is set exactly when the status is terminal
    CONSTRAINT execution_finished_iff_terminal CHECK (
        (finished IS NOT NULL) = (status IN ('completed', 'failed', 'timeout', 'canceled', 'abandoned'))
    )
);

CREATE INDEX execution_status_idx ON execution (status);
CREATE INDEX execution_action_ref_idx ON execution (action_ref, id DESC);
CREATE INDEX execution_created_idx ON execution (created);
-- in-flight work per worker: the queue depth the scheduler counts
CREATE INDEX execution_worker_inflight_idx ON execution (worker)
    WHERE status IN ('scheduled', 'running');

CREATE TABLE api_token (
    id         BIGSERIAL PRIMARY KEY,
    name       TEXT NOT NULL,
    -- SHA-256 of the token; the token itself is shown once and never stored
    token_hash BYTEA NOT NULL UNIQUE,
    created    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used  TIMESTAMPTZ,
    revoked    TIMESTAMPTZ
);
