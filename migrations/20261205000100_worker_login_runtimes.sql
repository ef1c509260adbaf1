-- The runtimes each worker login may serve, kept by the operator (issue 47). Until now a worker
-- registered whatever `capabilities.runtimes` it liked: a taken worker host could advertise
-- every runtime, be ranked for work that was never its own, and open the secrets of those runs.
-- Now a worker login's row may advertise, and its login may see, claim and open the secrets of,
-- only executions of the runtimes this table grants it. Only the schema's owner changes it
-- (`attune worker-login allow|deny`, or SQL).
CREATE TABLE worker_login_runtime (
    login name NOT NULL,
    runtime TEXT NOT NULL CHECK (runtime <> ''),
    granted TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (login, runtime)
);
-- a deployment that ran before keeps working: each worker login may serve what it advertised
INSERT INTO worker_login_runtime (login, runtime)
SELECT DISTINCT w.login, r.runtime
FROM worker w,
     jsonb_array_elements_text(CASE WHEN jsonb_typeof(w.capabilities->'runtimes') = 'array'
                                    THEN w.capabilities->'runtimes' ELSE '[]'::jsonb END) AS r(runtime)
WHERE worker_login(w.login) AND r.runtime <> ''
ON CONFLICT DO NOTHING;
REVOKE ALL ON worker_login_runtime FROM attune_api, attune_executor;
GRANT SELECT ON worker_login_runtime TO attune_api, attune_executor, attune_worker;

-- whether every runtime `capabilities` advertises is granted to the session's login
CREATE FUNCTION runtimes_granted(capabilities JSONB) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(capabilities->'runtimes') = 'array'
                                                     THEN capabilities->'runtimes' ELSE '[]'::jsonb END) AS r(runtime)
        WHERE r.runtime NOT IN (SELECT g.runtime FROM public.worker_login_runtime g WHERE g.login = session_user))
$$;

CREATE POLICY worker_runtimes_insert ON worker AS RESTRICTIVE FOR INSERT TO attune_worker
    WITH CHECK (runtimes_granted(capabilities));
CREATE POLICY worker_runtimes_update ON worker AS RESTRICTIVE FOR UPDATE TO attune_worker
    USING (true) WITH CHECK (runtimes_granted(capabilities));

DROP POLICY execution_own ON execution;
CREATE POLICY execution_own ON execution AS RESTRICTIVE TO attune_worker
    USING (worker = ANY (ARRAY(SELECT w.id FROM worker w WHERE w.login = session_user))
        AND runtime IN (SELECT g.runtime FROM worker_login_runtime g WHERE g.login = session_user))
    WITH CHECK (worker = ANY (ARRAY(SELECT w.id FROM worker w WHERE w.login = session_user))
        AND runtime IN (SELECT g.runtime FROM worker_login_runtime g WHERE g.login = session_user)
        AND status IN ('scheduled', 'running', 'completed'));

CREATE OR REPLACE FUNCTION run_secrets(p_execution BIGINT, p_names TEXT[]) RETURNS TABLE (name TEXT, sealed BYTEA)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.name, s.sealed FROM public.secret s, public.execution e
    WHERE e.id = p_execution AND s.name = ANY (p_names)
      AND e.status IN ('scheduled', 'running')
      AND (NOT public.worker_login(session_user)
           OR (e.worker IN (SELECT w.id FROM public.worker w WHERE w.login = session_user)
               AND e.runtime IN (SELECT g.runtime FROM public.worker_login_runtime g WHERE g.login = session_user)))
      AND EXISTS (SELECT 1 FROM jsonb_each(e.parameters) AS p(key, value)
                  WHERE jsonb_typeof(p.value) = 'object' AND p.value->>'$secret' = s.name)
$$;
