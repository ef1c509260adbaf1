-- A worker's rights on its own executions, narrowed (issue 32, after review):
--
-- * It updates only the columns of its own steps (claim, record a success, keep its report,
--   mark what it holds), never what runs (action, parameters, runtime), who asked (submitted_by),
--   the chain (original_execution) or where (worker); and only into the states it moves them to
--   itself (scheduled, running, completed).
-- * Its hand-back (scheduled -> requested, on no worker) is `execution_hand_back`, which runs as
--   the schema's owner: under row-level security a login cannot write a row it may not then see.
-- * A worker row registered by a login that is not a worker login (the owner, before logins were
--   recorded, or a single-role set-up) may be taken over by a worker login claiming its name,
--   which records itself; one registered by another worker login may not.

REVOKE UPDATE ON execution FROM attune_worker;
GRANT UPDATE (status, updated, started, finished, run_token, result, error, exit_code, stdout, stderr,
    http_status, report, reported_at) ON execution TO attune_worker;

DROP POLICY execution_own ON execution;
CREATE POLICY execution_own ON execution AS RESTRICTIVE TO attune_worker
    USING (worker = ANY (ARRAY(SELECT w.id FROM worker w WHERE w.login = session_user)))
    WITH CHECK (worker = ANY (ARRAY(SELECT w.id FROM worker w WHERE w.login = session_user))
        AND status IN ('scheduled', 'running', 'completed'));

CREATE FUNCTION execution_hand_back(p_id BIGINT, p_worker BIGINT) RETURNS SETOF execution
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    UPDATE execution SET status = 'requested', worker = NULL, updated = now()
    WHERE id = p_id AND worker = p_worker AND status = 'scheduled'
      AND EXISTS (SELECT 1 FROM worker w WHERE w.id = p_worker
          AND (w.login = session_user OR NOT pg_has_role(session_user, 'attune_worker', 'MEMBER')))
    RETURNING *;
$$;
REVOKE ALL ON FUNCTION execution_hand_back(BIGINT, BIGINT) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION execution_hand_back(BIGINT, BIGINT) TO attune_worker, attune_executor, attune_api;

-- whether `login` is a worker login (a member of attune_worker)
CREATE FUNCTION worker_login(login name) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = login AND pg_has_role(r.oid, 'attune_worker', 'MEMBER'))
$$;

DROP POLICY worker_own_update ON worker;
CREATE POLICY worker_own_update ON worker AS RESTRICTIVE FOR UPDATE TO attune_worker
    USING (login = session_user OR NOT worker_login(login)) WITH CHECK (login = session_user);
REVOKE UPDATE ON worker FROM attune_worker;
GRANT UPDATE (status, capabilities, last_heartbeat, updated, login) ON worker TO attune_worker;
