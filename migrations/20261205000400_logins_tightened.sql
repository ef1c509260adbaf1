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


REVOKE INSERT, UPDATE ON worker FROM attune_executor;
GRANT UPDATE (status, updated, capabilities, not_receiving_until) ON worker TO attune_executor;

ALTER FUNCTION audit_schedule_stopped(TEXT, TEXT) SET search_path = public, pg_temp;
