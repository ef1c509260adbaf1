-- Retry policy beyond the seeds: retry rules, Tasker's max_attempts/retryable, unlimited retries
-- (max_retries = -1), HTTP actions, one idempotency key per retry chain, and a circuit breaker per
-- action. The decision itself is attune_core::retry::decide; is_execution_retriable below agrees
-- with it (executor/tests/retry_manager.rs draws random executions and rules to check).

-- The HTTP status an http action got (null for other runtimes, and when no response came).
ALTER TABLE execution ADD COLUMN http_status INTEGER;

-- The same for every attempt of a chain: the first attempt draws it, a retry copies its parent's.
-- Actions see it as ATTUNE_IDEMPOTENCY_KEY; http actions send it as the Idempotency-Key header.
ALTER TABLE execution ADD COLUMN idempotency_key TEXT NOT NULL DEFAULT gen_random_uuid()::text;

-- The request of a `runtime: http` action (its `http:` block: method, url, headers, body).
ALTER TABLE action ADD COLUMN http JSONB;

-- One row per action whose circuit has ever been evaluated (see attune_core::circuit).
CREATE TABLE action_circuit (
    action     BIGINT PRIMARY KEY REFERENCES action(id) ON DELETE CASCADE,
    state      TEXT NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open')),
    -- the end of the open period (open and half_open)
    open_until TIMESTAMPTZ,
    -- the one execution dispatched while half_open
    trial      BIGINT,
    -- failures finished before this are forgotten
    closed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- what the last evaluation counted in the window
    window_finished INTEGER NOT NULL DEFAULT 0,
    window_failed   INTEGER NOT NULL DEFAULT 0,
    opened_count    BIGINT NOT NULL DEFAULT 0,
    updated    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((state = 'closed') = (open_until IS NULL))
);

-- Whether `rule` (one entry of an action's retry.rules) matches a failure: any listed condition
-- holding. Mirrors attune_core::retry::rule_matches.
CREATE FUNCTION retry_rule_matches(
    rule JSONB, kind TEXT, exit_code INTEGER, http_status INTEGER, result JSONB
) RETURNS BOOLEAN
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(
           (exit_code IS NOT NULL AND rule->'when' ? 'exit_codes'
                AND rule->'when'->'exit_codes' @> to_jsonb(exit_code))
        OR (rule->'when' ? 'failure_kinds' AND rule->'when'->'failure_kinds' @> to_jsonb(kind))
        OR (http_status IS NOT NULL AND rule->'when' ? 'http_status'
                AND rule->'when'->'http_status' @> to_jsonb(http_status))
        OR (result IS NOT NULL AND rule->'when' ? 'result' AND EXISTS (
                SELECT 1
                FROM jsonb_array_elements(
                    CASE WHEN rule->'when'->'result' ? 'in' THEN rule->'when'->'result'->'in'
                         ELSE jsonb_build_array(rule->'when'->'result'->'equals') END
                ) AS wanted(value)
                WHERE result #> string_to_array(rule->'when'->'result'->>'path', '.') = wanted.value
            )),
        FALSE)
$$;

-- Whether the automatic retry path would retry this execution now. In order: it failed (or timed
-- out) and has not been retried yet; a person did not end it (canceled, operator_failed); it is
-- not a non-idempotent action that may have started on a worker that vanished; retries are
-- enabled; the action is retryable; then the first matching retry rule decides (fail, or retry
-- while attempts remain: its own `attempts`, else max_retries); with no rule matching, its kind
-- must be one the action retries and it must have retries left (max_retries -1: unlimited).
-- An open circuit holds a retry back but does not prevent it.
DROP FUNCTION is_execution_retriable(BIGINT);
CREATE FUNCTION is_execution_retriable(execution_id BIGINT) RETURNS BOOLEAN
LANGUAGE plpgsql STABLE AS $$
DECLARE
    e execution%ROWTYPE;
    policy JSONB;
    kind TEXT;
    budget INTEGER;
    rule JSONB;
BEGIN
    SELECT * INTO e FROM execution WHERE id = execution_id;
    IF NOT FOUND OR e.status NOT IN ('failed', 'timeout') THEN
        RETURN FALSE;
    END IF;
    IF EXISTS (SELECT 1 FROM execution r WHERE r.original_execution = e.id) THEN
        RETURN FALSE;
    END IF;
    SELECT a.retry_policy INTO policy FROM action a WHERE a.id = e.action;
    policy := COALESCE(policy, '{}');
    -- a failure recorded without a kind counts as the action's own failure
    kind := COALESCE(e.failure_kind, 'action_failed');
    IF kind IN ('canceled', 'operator_failed') THEN
        RETURN FALSE;
    END IF;
    IF COALESCE((policy->>'idempotent')::BOOLEAN, TRUE) = FALSE
       AND (kind = 'worker_heartbeat_stale' OR (kind = 'worker_unavailable' AND e.started IS NOT NULL)) THEN
        RETURN FALSE;
    END IF;
    IF NOT COALESCE((SELECT enabled FROM retry_config), TRUE) THEN
        RETURN FALSE;
    END IF;
    IF COALESCE((policy->>'retryable')::BOOLEAN, TRUE) = FALSE THEN
        RETURN FALSE;
    END IF;
    budget := COALESCE(e.max_retries, 0);
    FOR rule IN SELECT value FROM jsonb_array_elements(COALESCE(policy->'rules', '[]')) WITH ORDINALITY ORDER BY ordinality
    LOOP
        IF retry_rule_matches(rule, kind, e.exit_code, e.http_status, e.result) THEN
            IF rule->'then'->>'do' = 'fail' THEN
                RETURN FALSE;
            END IF;
            IF rule->'then' ? 'attempts' THEN
                budget := (rule->'then'->>'attempts')::INTEGER - 1;
            END IF;
            RETURN budget < 0 OR e.retry_count < budget;
        END IF;
    END LOOP;
    RETURN kind = ANY (
            CASE WHEN policy ? 'on'
                THEN ARRAY(SELECT jsonb_array_elements_text(policy->'on'))
                ELSE ARRAY['worker_unavailable', 'queue_timeout', 'worker_heartbeat_stale',
                           'transient_error', 'manual_retry']
            END)
        AND (budget < 0 OR e.retry_count < budget);
END
$$;
