-- A worker's login reads only the secrets its own runs refer to (issue 32, after review): no
-- SELECT on the secret table, but `run_secrets`, which answers the secrets among `p_names` that
-- the parameters of `p_execution` refer to (`{"$secret": name}`), while it is scheduled or
-- running on a worker this login registered. A taken worker host opens what its own runs use,
-- not the whole store.
CREATE FUNCTION run_secrets(p_execution BIGINT, p_names TEXT[]) RETURNS TABLE (name TEXT, sealed BYTEA)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.name, s.sealed FROM public.secret s, public.execution e
    WHERE e.id = p_execution AND s.name = ANY (p_names)
      AND e.status IN ('scheduled', 'running')
      AND (NOT public.worker_login(session_user)
           OR e.worker IN (SELECT w.id FROM public.worker w WHERE w.login = session_user))
      AND EXISTS (SELECT 1 FROM jsonb_each(e.parameters) AS p(key, value)
                  WHERE jsonb_typeof(p.value) = 'object' AND p.value->>'$secret' = s.name)
$$;
REVOKE ALL ON FUNCTION run_secrets(BIGINT, TEXT[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION run_secrets(BIGINT, TEXT[]) TO attune_worker;
REVOKE SELECT ON secret FROM attune_worker;
