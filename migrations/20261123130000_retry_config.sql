-- The executors' global retry settings (ATTUNE_RETRY_*), written by each executor at start as
-- health_probe_config is, so that an operator can read what is in force in SQL
-- (`SELECT * FROM retry_config;`, the quick reference's "verify retry enabled in executor
-- config") and through `GET /api/v1/config`. An action's own `retry:` block overrides it.
CREATE TABLE retry_config (
    singleton          BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    enabled            BOOLEAN NOT NULL DEFAULT TRUE,
    base_backoff_secs  DOUBLE PRECISION NOT NULL DEFAULT 1,
    max_backoff_secs   DOUBLE PRECISION NOT NULL DEFAULT 300,
    backoff_multiplier DOUBLE PRECISION NOT NULL DEFAULT 2,
    jitter_factor      DOUBLE PRECISION NOT NULL DEFAULT 0.2,
    updated            TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO retry_config DEFAULT VALUES;
