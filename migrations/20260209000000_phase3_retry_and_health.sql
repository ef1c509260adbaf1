-- Phase 3: intelligent retry and worker health.
-- Retry columns on action and execution, the health thresholds the executor runs with,
-- the healthy_workers view and the helper functions SREs call from psql.
-- The SQL here mirrors the Rust decision core (common::health, common::retry); tests hold them together.

-- Per-action policy --------------------------------------------------------------------------------
ALTER TABLE action
    ADD COLUMN timeout_seconds INTEGER,           -- per-action timeout override (NULL: the global default)
    ADD COLUMN max_retries     INTEGER DEFAULT 0, -- per-action retry limit (retries after the first attempt)
    -- the optional `retry:` block of the action YAML, validated at pack load (NULL: global defaults)
    ADD COLUMN retry_policy    JSONB;

-- Execution retry fields ---------------------------------------------------------------------------
ALTER TABLE execution
    ADD COLUMN retry_count        INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN max_retries        INTEGER,
    ADD COLUMN retry_reason       TEXT,
    -- the execution this one retries (its immediate parent)
    ADD COLUMN original_execution BIGINT REFERENCES execution(id),
    -- a delayed retry becomes requested at this time
    ADD COLUMN not_before         TIMESTAMPTZ,
    -- copied from the action at submission, so the deadline survives a later pack update
    ADD COLUMN timeout_seconds    INTEGER;

-- At most one retry per failed execution: a redelivered failure can never spawn two.
CREATE UNIQUE INDEX execution_one_retry_per_parent ON execution (original_execution)
    WHERE original_execution IS NOT NULL;
CREATE INDEX execution_delayed_due_idx ON execution (not_before) WHERE status = 'delayed';

-- Health thresholds --------------------------------------------------------------------------------
-- One row: the HealthProbeConfig the executors run with (they write it at start-up), so that the
-- view below classifies exactly as the scheduler does.
CREATE TABLE health_probe_config (
    singleton                   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    -- FALSE: the probe is off and every active worker counts as healthy
    enabled                     BOOLEAN NOT NULL DEFAULT TRUE,
    heartbeat_max_age_secs      INTEGER NOT NULL DEFAULT 30,
    degraded_threshold          INTEGER NOT NULL DEFAULT 3,
    unhealthy_threshold         INTEGER NOT NULL DEFAULT 10,
    queue_depth_degraded        INTEGER NOT NULL DEFAULT 50,
    queue_depth_unhealthy       INTEGER NOT NULL DEFAULT 100,
    failure_rate_degraded       DOUBLE PRECISION NOT NULL DEFAULT 0.3,
    failure_rate_unhealthy      DOUBLE PRECISION NOT NULL DEFAULT 0.7,
    -- below this many executions the failure rate says too little to condemn a worker
    failure_rate_min_executions INTEGER NOT NULL DEFAULT 10
);
INSERT INTO health_probe_config DEFAULT VALUES;

-- A worker's queue depth: the executions dispatched to it and not yet finished, or what the
-- worker itself last reported if that is more. Mirrors common::db::worker.
CREATE FUNCTION get_worker_queue_depth(worker_id BIGINT) RETURNS INTEGER
LANGUAGE sql STABLE AS $$
    SELECT GREATEST(
        (SELECT count(*) FROM execution WHERE worker = worker_id AND status IN ('scheduled', 'running')),
        COALESCE((SELECT (capabilities->'health'->>'queue_depth')::BIGINT FROM worker WHERE id = worker_id), 0)
    )::INTEGER
$$;

-- The health class of a worker: the worst class any one signal gives; a stale or missing heartbeat
-- is unhealthy whatever the worker reported. Mirrors common::health::classify.
CREATE FUNCTION worker_health_class(
    capabilities JSONB, last_heartbeat TIMESTAMPTZ, queue_depth INTEGER, at TIMESTAMPTZ
) RETURNS TEXT
LANGUAGE sql STABLE AS $$
    WITH c AS (SELECT * FROM health_probe_config),
    h AS (
        SELECT
            COALESCE((capabilities->'health'->>'consecutive_failures')::BIGINT, 0) AS failures,
            COALESCE((capabilities->'health'->>'total_executions')::BIGINT, 0) AS total,
            COALESCE((capabilities->'health'->>'failed_executions')::BIGINT, 0) AS failed
    )
    SELECT CASE
        WHEN NOT c.enabled THEN 'healthy'
        WHEN last_heartbeat IS NULL
          OR at - last_heartbeat >= make_interval(secs => c.heartbeat_max_age_secs) THEN 'unhealthy'
        WHEN h.failures >= c.unhealthy_threshold THEN 'unhealthy'
        WHEN queue_depth >= c.queue_depth_unhealthy THEN 'unhealthy'
        WHEN h.total > 0 AND h.total >= c.failure_rate_min_executions
         AND h.failed::DOUBLE PRECISION / h.total >= c.failure_rate_unhealthy THEN 'unhealthy'
        WHEN h.failures >= c.degraded_threshold THEN 'degraded'
        WHEN queue_depth >= c.queue_depth_degraded THEN 'degraded'
        WHEN h.total > 0 AND h.total >= c.failure_rate_min_executions
         AND h.failed::DOUBLE PRECISION / h.total >= c.failure_rate_degraded THEN 'degraded'
        ELSE 'healthy'
    END
    FROM c, h
$$;

-- Workers that may receive new work (healthy first, then degraded; unhealthy ones are left out),
-- with the class the scheduler computes and the signals behind it.
CREATE VIEW healthy_workers AS
SELECT
    w.id,
    w.name,
    w.status,
    worker_health_class(w.capabilities, w.last_heartbeat, get_worker_queue_depth(w.id), now()) AS health,
    get_worker_queue_depth(w.id) AS queue_depth,
    COALESCE((w.capabilities->'health'->>'consecutive_failures')::INTEGER, 0) AS consecutive_failures,
    COALESCE((w.capabilities->'health'->>'total_executions')::BIGINT, 0) AS total_executions,
    COALESCE((w.capabilities->'health'->>'failed_executions')::BIGINT, 0) AS failed_executions,
    w.capabilities->'runtimes' AS runtimes,
    w.last_heartbeat,
    now() - w.last_heartbeat AS heartbeat_age
FROM worker w
WHERE w.status = 'active'
  AND worker_health_class(w.capabilities, w.last_heartbeat, get_worker_queue_depth(w.id), now())
      IN ('healthy', 'degraded');

-- Whether the automatic retry path would retry this execution now: it failed (or timed out), its
-- failure kind is one its action retries (the action's retry.on, else the retriable kinds), it has
-- retries left, it has not been retried yet, and it is not a non-idempotent action that may have
-- started on a worker that vanished. Mirrors common::retry::decide (with retries enabled).
CREATE FUNCTION is_execution_retriable(execution_id BIGINT) RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((
        SELECT
            e.status IN ('failed', 'timeout')
            AND e.retry_count < COALESCE(e.max_retries, 0)
            -- a failure recorded without a kind counts as the action's own failure
            AND COALESCE(e.failure_kind, 'action_failed') = ANY (
                CASE WHEN a.retry_policy ? 'on'
                    THEN ARRAY(SELECT jsonb_array_elements_text(a.retry_policy->'on'))
                    ELSE ARRAY['worker_unavailable', 'queue_timeout', 'worker_heartbeat_stale',
                               'transient_error', 'manual_retry']
                END
            )
            AND NOT (
                COALESCE((a.retry_policy->>'idempotent')::BOOLEAN, TRUE) = FALSE
                AND (COALESCE(e.failure_kind, 'action_failed') = 'worker_heartbeat_stale'
                     OR (COALESCE(e.failure_kind, 'action_failed') = 'worker_unavailable' AND e.started IS NOT NULL))
            )
            AND NOT EXISTS (SELECT 1 FROM execution r WHERE r.original_execution = e.id)
        FROM execution e
        LEFT JOIN action a ON a.id = e.action
        WHERE e.id = execution_id
    ), FALSE)
$$;
