-- The executors' login narrowed (issue 47). Until now it held every right on every table but the
-- tokens, the secrets and a few others: it could rewrite an action (runtime, http, entrypoint) or
-- insert an execution whose parameters name any secret, and so have a worker open the secret and
-- send it where the executor chose; and it could delete the whole audit trail. What the
-- executors do needs none of that:
--
-- * actions and packs are registered by the API: the executors read them;
-- * an execution's request (action, parameters, runtime, who asked, its chain) is written once,
--   by the API or a schedule: the executors change only the columns of its progress;
-- * a retry copies its parent's request: `execution_insert_retry`, run as the schema's owner,
--   makes it from the parent's row, and only of a parent that ended without success and has no
--   retry yet; the executors insert no execution of their own;
-- * a schedule's occurrence is made from the schedule's row: `schedule_fire`;
-- * audit events go only once past a retention age the database keeps (`audit_retention`, which
--   only its owner changes): `audit_prune` never removes an event younger than that, whatever
--   age the executors ask for.

REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON pack, action FROM attune_executor;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON _sqlx_migrations FROM attune_executor;

REVOKE INSERT, UPDATE, TRUNCATE ON execution FROM attune_executor;
GRANT UPDATE (config, status, worker, result, failure_kind, error, exit_code, stdout, stderr, started, finished,
    updated, max_retries, retry_reason, not_before, timeout_seconds, retry_decision, http_status, run_token,
    ended_by, report, reported_at, concurrency_limited, lingering) ON execution TO attune_executor;
-- what retention moves aside is not rewritten there either
REVOKE UPDATE, TRUNCATE ON execution_archive FROM attune_executor;

-- A retry of `p_parent`: its request copied from the parent's row; the executors give only how
-- it waits (`p_status`, `p_not_before`), why (`p_reason`) and the chain's bookkeeping in
-- `p_config` (whose request fields are the parent's again here).
CREATE FUNCTION execution_insert_retry(p_parent BIGINT, p_status execution_status, p_reason TEXT,
    p_not_before TIMESTAMPTZ, p_config JSONB) RETURNS SETOF execution
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF p_status NOT IN ('requested', 'delayed') THEN
        RAISE EXCEPTION 'a retry starts requested or delayed, not %', p_status USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    INSERT INTO execution (action, action_ref, parameters, config, status, max_retries, timeout_seconds,
        retry_count, retry_reason, original_execution, not_before, runtime, idempotency_key, submitted_by,
        trace_parent, schedule, scheduled_for)
    SELECT p.action, p.action_ref, p.parameters,
        COALESCE(p_config, '{}'::jsonb) || jsonb_build_object('retry_of', p.id, 'original_execution', p.id,
            'retry_reason', p_reason, 'max_retries', COALESCE(p.max_retries, 0), 'retry_count', p.retry_count + 1),
        p_status, COALESCE(p.max_retries, 0), COALESCE(p.timeout_seconds, 300), p.retry_count + 1, p_reason,
        p.id, p_not_before, p.runtime, p.idempotency_key, p.submitted_by, p.trace_parent, p.schedule, p.scheduled_for
    FROM execution p
    WHERE p.id = p_parent AND p.status IN ('failed', 'timeout', 'abandoned')
    RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'execution % has not ended without success: it is not retried', p_parent
            USING ERRCODE = '22023';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION execution_insert_retry(BIGINT, execution_status, TEXT, TIMESTAMPTZ, JSONB) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION execution_insert_retry(BIGINT, execution_status, TEXT, TIMESTAMPTZ, JSONB) TO attune_executor;

-- The occurrence `p_at` of schedule `p_schedule`, made from the schedule's row (its action, its
-- parameters, its owner), only while it is not paused, its token live, and `p_at` due; `NULL`
-- otherwise, or when it was made already.
CREATE FUNCTION schedule_fire(p_schedule BIGINT, p_at TIMESTAMPTZ, p_default_timeout INTEGER) RETURNS BIGINT
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    INSERT INTO execution (action, action_ref, runtime, parameters, config, status, max_retries,
        timeout_seconds, retry_count, idempotency_key, submitted_by, schedule, scheduled_for)
    SELECT a.id, s.action_ref, a.runtime, s.parameters,
        jsonb_build_object('max_retries', COALESCE(a.max_retries, 0), 'retry_count', 0,
            'schedule', s.name, 'scheduled_for', p_at),
        'requested', COALESCE(a.max_retries, 0), COALESCE(a.timeout_seconds, p_default_timeout), 0,
        gen_random_uuid()::text, s.created_by, s.id, p_at
    FROM schedule s LEFT JOIN action a ON a.ref = s.action_ref
    WHERE s.id = p_schedule AND NOT s.paused AND p_at <= now()
      AND (s.created_by IS NULL OR EXISTS (
          SELECT 1 FROM api_token t WHERE t.id = s.created_by AND t.revoked IS NULL
             AND (t.expires IS NULL OR t.expires > now())))
    ON CONFLICT (schedule, scheduled_for) WHERE schedule IS NOT NULL AND original_execution IS NULL
    DO NOTHING RETURNING id
$$;
REVOKE ALL ON FUNCTION schedule_fire(BIGINT, TIMESTAMPTZ, INTEGER) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_fire(BIGINT, TIMESTAMPTZ, INTEGER) TO attune_executor;

-- The youngest an audit event may be to be removed, whatever the executors' setting says.
CREATE TABLE audit_retention (
    only_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    min_age INTERVAL NOT NULL CHECK (min_age >= interval '0')
);
INSERT INTO audit_retention (min_age) VALUES (interval '90 days');
REVOKE ALL ON audit_retention FROM attune_api, attune_executor;
GRANT SELECT ON audit_retention TO attune_executor, attune_api;

-- Removes (or, with `p_archive`, moves into audit_event_archive) up to `p_batch` events older
-- than `p_age_secs` and than `audit_retention.min_age`, oldest first; how many.
CREATE FUNCTION audit_prune(p_age_secs DOUBLE PRECISION, p_batch BIGINT, p_archive BOOLEAN) RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    removed BIGINT;
    before TIMESTAMPTZ := now() - GREATEST(make_interval(secs => p_age_secs), (SELECT min_age FROM audit_retention));
BEGIN
    IF p_archive THEN
        WITH gone AS (DELETE FROM audit_event WHERE id IN (
                SELECT id FROM audit_event WHERE at < before ORDER BY at LIMIT p_batch) RETURNING *),
            archived AS (INSERT INTO audit_event_archive SELECT * FROM gone)
        SELECT count(*) INTO removed FROM gone;
    ELSE
        WITH gone AS (DELETE FROM audit_event WHERE id IN (
                SELECT id FROM audit_event WHERE at < before ORDER BY at LIMIT p_batch) RETURNING *)
        SELECT count(*) INTO removed FROM gone;
    END IF;
    RETURN removed;
END
$$;
REVOKE ALL ON FUNCTION audit_prune(DOUBLE PRECISION, BIGINT, BOOLEAN) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit_prune(DOUBLE PRECISION, BIGINT, BOOLEAN) TO attune_executor;
REVOKE DELETE, TRUNCATE ON audit_event FROM attune_executor;
REVOKE INSERT ON audit_event_archive FROM attune_executor;
