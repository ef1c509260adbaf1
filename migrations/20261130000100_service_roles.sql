-- One database role per service, each with only the rights it needs (issue 32). The role that
-- runs the migrations (`attune migrate`) owns the schema; the services log in as roles that are
-- members of these three group roles (NOLOGIN: the installer creates the logins, with their
-- passwords, and grants them one of these):
--
--   attune_api       reads and writes what the API serves: executions (submit, cancel, retry),
--                    packs and actions (register), tokens (create, revoke), idempotency keys.
--   attune_executor  everything the executors do (scheduling, results, retries, monitor,
--                    history), and nothing of the tokens.
--   attune_worker    reads the actions and packs it runs, registers and updates its own worker
--                    rows, and sees and changes only the executions placed on its own workers:
--                    a worker's login is recorded on its row (`worker.login`), and row-level
--                    security limits a member of attune_worker to executions whose `worker` is
--                    one of the rows its login registered (or, handing one back, none).
--
-- Creating the group roles needs CREATEROLE (or a superuser); where the roles exist already
-- (another database of the cluster, or made by hand) nothing is created.

DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['attune_api', 'attune_executor', 'attune_worker'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', name);
            EXCEPTION
                -- another database's migration made it at the same moment
                WHEN duplicate_object OR unique_violation THEN NULL;
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'cannot create the role %: the migration role (%) needs CREATEROLE, or create the roles attune_api, attune_executor and attune_worker (NOLOGIN) beforehand', name, current_user;
            END;
        END IF;
    END LOOP;
END
$$;

-- Nobody but the owner and the roles below: not PUBLIC.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO attune_api, attune_executor, attune_worker;

-- The API: every table (the token list is admin's, by the API's own roles).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO attune_api;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO attune_api;

-- The executors: every table but the tokens.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO attune_executor;
REVOKE ALL ON api_token FROM attune_executor;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO attune_executor;

-- The workers: what to run, their own rows, their own executions.
GRANT SELECT ON pack, action, failure_kind, health_probe_config, retry_config, action_circuit TO attune_worker;
GRANT SELECT, INSERT, UPDATE ON worker TO attune_worker;
GRANT USAGE ON SEQUENCE worker_id_seq TO attune_worker;
GRANT SELECT, UPDATE ON execution TO attune_worker;
-- every service checks at start that the schema is current (`db::check_schema`)
GRANT SELECT ON _sqlx_migrations TO attune_worker;

-- Tables a later migration creates start with the same rights for the API and the executors;
-- such a migration grants the workers' by itself.
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO attune_api, attune_executor;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO attune_api, attune_executor;

-- Which login registered each worker row (a worker's takeover of its name keeps it).
ALTER TABLE worker ADD COLUMN login name NOT NULL DEFAULT session_user;

-- The workers' own rows: any login sees every worker, but inserts and changes only its own.
ALTER TABLE worker ENABLE ROW LEVEL SECURITY;
CREATE POLICY worker_everyone ON worker USING (true) WITH CHECK (true);
CREATE POLICY worker_own_insert ON worker AS RESTRICTIVE FOR INSERT TO attune_worker
    WITH CHECK (login = session_user);
CREATE POLICY worker_own_update ON worker AS RESTRICTIVE FOR UPDATE TO attune_worker
    USING (login = session_user) WITH CHECK (login = session_user);

-- The workers' own executions: placed on a worker row of the same login. A hand-back leaves the
-- execution on no worker.
ALTER TABLE execution ENABLE ROW LEVEL SECURITY;
CREATE POLICY execution_everyone ON execution USING (true) WITH CHECK (true);
CREATE POLICY execution_own ON execution AS RESTRICTIVE TO attune_worker
    USING (worker = ANY (ARRAY(SELECT w.id FROM worker w WHERE w.login = session_user)))
    WITH CHECK (worker IS NULL OR worker = ANY (ARRAY(SELECT w.id FROM worker w WHERE w.login = session_user)));
