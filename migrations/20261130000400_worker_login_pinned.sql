-- `worker_login` pinned to the catalog (review): it runs inside the worker table's row-level
-- security with the caller's search_path, so a temporary table named pg_roles could answer for
-- it. It names pg_catalog.pg_roles and fixes its search_path. A superuser (which bypasses
-- row-level security anyway, and is a member of every role) is not a worker login: rows it
-- registered are taken over like the owner's.
CREATE OR REPLACE FUNCTION worker_login(login name) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_roles r
        WHERE r.rolname = login AND NOT r.rolsuper AND pg_catalog.pg_has_role(r.oid, 'attune_worker', 'MEMBER'))
$$;
-- no temporary tables for anyone but those granted them: nothing shadows a table's name (where
-- the migrating role may say so: it owns the database)
DO $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'TEMPORARY on this database stays granted to PUBLIC (the migrating role does not own it)';
END
$$;
