-- A platform loss (a worker or its supervisor lost, a dispatch expired unstarted) is retried
-- whatever the action's max_retries, up to three times in a chain, and never spends that budget
-- (issue 46; `attune_core::retry::PLATFORM_RETRIES`, `FailureKind::is_platform_loss`). The
-- chain's count of the retries the platform's budget paid is `config.platform_retries` (written
-- by the RetryManager alone: a client's is dropped). The quick reference's
-- `is_execution_retriable` says the same as the RetryManager decides.
CREATE OR REPLACE FUNCTION is_execution_retriable(execution_id BIGINT) RETURNS BOOLEAN
LANGUAGE plpgsql STABLE AS $$
DECLARE
    e execution%ROWTYPE;
    policy JSONB;
    kind TEXT;
    budget INTEGER;
    rule JSONB;
    platform INTEGER;
    own INTEGER;
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
    platform := CASE WHEN jsonb_typeof(e.config->'platform_retries') = 'number'
                     THEN LEAST(GREATEST((e.config->>'platform_retries')::NUMERIC, 0), 2147483647)::INTEGER
                     ELSE 0 END;
    own := e.retry_count - LEAST(GREATEST(platform, 0), e.retry_count);
    FOR rule IN SELECT value FROM jsonb_array_elements(COALESCE(policy->'rules', '[]')) WITH ORDINALITY ORDER BY ordinality
    LOOP
        IF retry_rule_matches(rule, kind, e.exit_code, e.http_status, e.result) THEN
            IF rule->'then'->>'do' = 'fail' THEN
                RETURN FALSE;
            END IF;
            IF rule->'then' ? 'attempts' THEN
                budget := (rule->'then'->>'attempts')::INTEGER - 1;
            END IF;
            RETURN budget < 0 OR own < budget;
        END IF;
    END LOOP;
    RETURN kind = ANY (
            CASE WHEN policy ? 'on'
                THEN ARRAY(SELECT jsonb_array_elements_text(policy->'on'))
                ELSE ARRAY['worker_unavailable', 'queue_timeout', 'worker_heartbeat_stale',
                           'transient_error', 'manual_retry']
            END)
        AND (budget < 0 OR own < budget
             OR (kind IN ('worker_unavailable', 'queue_timeout', 'worker_heartbeat_stale') AND platform < 3));
END
$$;
