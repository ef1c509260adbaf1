-- After review (issue 47):
--
-- * A worker login's runtimes are held to its grant by a trigger that leaves the others out of
--   what its row advertises, rather than by a policy that refuses the row: a runtime taken back
--   (`attune worker-login deny`) from a running worker stops its dispatches at its next
--   heartbeat, and the heartbeats go on (refused, the worker lost its lease and every run).
--   Anything but an array of names advertises nothing.
-- * A finished execution stays finished for every service's login: the state machine has no way
--   out of a terminal state, and the executors' login could otherwise set a run back to
--   `requested` and have a worker open its secrets again.
-- * A schedule fires only while it is not paused and its token is live, and only for an
--   occurrence that is due.
-- * The executors' login changes of a worker row only what it decides (its status, its
--   consuming mark, its not-receiving time), not the login or the broker user it is believed as.
-- * `audit_schedule_stopped` puts temporary objects last in its search path.

DROP POLICY worker_runtimes_insert ON worker;
DROP POLICY worker_runtimes_update ON worker;

CREATE FUNCTION worker_runtimes_granted_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF public.worker_login(session_user) THEN
        IF jsonb_typeof(NEW.capabilities) IS DISTINCT FROM 'object' THEN
            NEW.capabilities := '{}'::jsonb;
        END IF;
        NEW.capabilities := jsonb_set(NEW.capabilities, '{runtimes}', COALESCE((
            SELECT jsonb_agg(r.runtime ORDER BY r.n)
            FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(NEW.capabilities->'runtimes') = 'array'
                                                THEN NEW.capabilities->'runtimes' ELSE '[]'::jsonb END)
                 WITH ORDINALITY AS r(runtime, n)
            WHERE r.runtime IN (SELECT g.runtime FROM public.worker_login_runtime g WHERE g.login = session_user)),
            '[]'::jsonb));
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER worker_runtimes_granted_only BEFORE INSERT OR UPDATE OF capabilities ON worker
    FOR EACH ROW EXECUTE FUNCTION worker_runtimes_granted_only();

-- whether `login` is one of the services' logins (a member of a service group, not a superuser)
CREATE FUNCTION service_login(login name) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_roles r
        WHERE r.rolname = login AND NOT r.rolsuper
          AND (pg_catalog.pg_has_role(r.oid, 'attune_executor', 'MEMBER')
               OR pg_catalog.pg_has_role(r.oid, 'attune_worker', 'MEMBER')
               OR pg_catalog.pg_has_role(r.oid, 'attune_api', 'MEMBER')))
$$;

CREATE FUNCTION execution_stays_finished() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF public.service_login(session_user) THEN
        RAISE EXCEPTION 'execution % has ended (%): it cannot become % (retry it: a new execution)',
            OLD.id, OLD.status, NEW.status USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER execution_stays_finished BEFORE UPDATE OF status ON execution
    FOR EACH ROW
    WHEN (OLD.status IN ('completed', 'failed', 'timeout', 'canceled', 'abandoned')
          AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION execution_stays_finished();

CREATE OR REPLACE FUNCTION schedule_fire(p_schedule BIGINT, p_at TIMESTAMPTZ, p_default_timeout INTEGER) RETURNS BIGINT
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

REVOKE INSERT, UPDATE ON worker FROM attune_executor;
GRANT UPDATE (status, updated, capabilities, not_receiving_until) ON worker TO attune_executor;

ALTER FUNCTION audit_schedule_stopped(TEXT, TEXT) SET search_path = public, pg_temp;
