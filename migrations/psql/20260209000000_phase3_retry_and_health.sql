-- The quick reference's Phase 3 migration command, for psql:
--
--   docker compose exec postgres psql -U attune -d attune -f /migrations/20260209000000_phase3_retry_and_health.sql
--
-- (docker-compose.yml mounts this directory at /migrations and the services' migrations at
-- /sqlx-migrations.) The services apply their migrations themselves, through sqlx, at start-up;
-- this file is for a database that has only the base schema. It applies Phase 3 (the file of the
-- same name in the sqlx migrations) and records it the way sqlx does, so the services go on from
-- there. On a database that already has Phase 3 (any database the services have started on) it
-- changes nothing and says so. It can be run any number of times.
--
-- `psql -v migrations=DIR` names the directory of the sqlx migrations (default /sqlx-migrations).

\set ON_ERROR_STOP on
\if :{?migrations}
\else
    \set migrations /sqlx-migrations
\endif

SELECT to_regclass('_sqlx_migrations') IS NOT NULL AND to_regclass('execution') IS NOT NULL AS has_base \gset
\if :has_base
    SELECT EXISTS (SELECT 1 FROM _sqlx_migrations WHERE version = 20260209000000) AS applied \gset
    \if :applied
        \echo 'Phase 3 (migration 20260209000000) is already applied: nothing to do.'
    \else
        BEGIN;
        \set phase3 :migrations /20260209000000_phase3_retry_and_health.sql
        \i :phase3
        -- the checksum sqlx keeps for the file (SHA-384 of its text): the services accept it
        INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
        VALUES (20260209000000, 'phase3 retry and health', true,
                '\xdfcc12db9fd10812fa78c604d6da7b7103cb0242fdb8e64b2aca95aca26403bf9bf4935ddea85c1af6962907c6b0d3b6',
                0);
        COMMIT;
        \echo 'Phase 3 (migration 20260209000000) applied.'
    \endif
\else
    \echo 'This database has no attune base schema: start the services once (they apply every migration), or run sqlx migrate run.'
\endif
