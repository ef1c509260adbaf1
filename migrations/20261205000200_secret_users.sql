-- A secret names the actions that may use it (issue 47): until now an operator could pass any
-- stored secret to any action, `core.echo` say, and read it in the output. `users` lists action
-- refs (`pack.name`), packs (`pack`: each of its actions) or `*` (any action). A secret made
-- before keeps `*`, which `attune secret list` shows; a new one must name its users.
CREATE FUNCTION secret_users_form(users TEXT[]) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT cardinality(users) BETWEEN 1 AND 64
       AND NOT EXISTS (SELECT 1 FROM unnest(users) AS u(user_)
                       WHERE u.user_ IS NULL OR NOT (u.user_ = '*' OR u.user_ ~ '^[A-Za-z0-9_-]{1,128}(\.[A-Za-z0-9_-]{1,128})?$'))
$$;

-- whether a secret with `users` may be passed to the action `action_ref`
CREATE FUNCTION secret_for(users TEXT[], action_ref TEXT) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(users) AS u(user_)
                   WHERE u.user_ = '*' OR u.user_ = action_ref
                      OR (strpos(u.user_, '.') = 0 AND left(action_ref, length(u.user_) + 1) = u.user_ || '.'))
$$;

ALTER TABLE secret ADD COLUMN users TEXT[] NOT NULL DEFAULT '{*}';
ALTER TABLE secret ALTER COLUMN users DROP DEFAULT;
ALTER TABLE secret ADD CONSTRAINT secret_users_form CHECK (secret_users_form(users));

CREATE OR REPLACE FUNCTION run_secrets(p_execution BIGINT, p_names TEXT[]) RETURNS TABLE (name TEXT, sealed BYTEA)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.name, s.sealed FROM public.secret s, public.execution e
    WHERE e.id = p_execution AND s.name = ANY (p_names)
      AND e.status IN ('scheduled', 'running')
      AND public.secret_for(s.users, e.action_ref)
      AND (NOT public.worker_login(session_user)
           OR (e.worker IN (SELECT w.id FROM public.worker w WHERE w.login = session_user)
               AND e.runtime IN (SELECT g.runtime FROM public.worker_login_runtime g WHERE g.login = session_user)))
      AND EXISTS (SELECT 1 FROM jsonb_each(e.parameters) AS p(key, value)
                  WHERE jsonb_typeof(p.value) = 'object' AND p.value->>'$secret' = s.name)
$$;
