#!/usr/bin/env bash
# Run by the postgres image when its data volume is created (/docker-entrypoint-initdb.d): one
# login per service, each a member of the group role the migrations grant to (made here first,
# NOLOGIN, so the logins can join them before `attune migrate` runs). A volume made before this
# script existed: run it once by hand (docker compose exec postgres bash
# /docker-entrypoint-initdb.d/attune-logins.sh).
set -euo pipefail
# (each worker service its own login: a taken worker container reaches only its own runs)
for pair in api:api executor:executor worker_shell:worker worker_python:worker; do
    service=${pair%%:*} group=${pair#*:}
    variable="POSTGRES_$(echo "$service" | tr a-z A-Z)_PASSWORD"
    password=${!variable:?set $variable}
    psql -v ON_ERROR_STOP=1 -q --username "${POSTGRES_USER:-attune}" --dbname "${POSTGRES_DB:-attune}" \
        -v role="attune_$group" -v login="attune_${service}_login" -v password="$password" <<'SQL'
SELECT format('CREATE ROLE %I NOLOGIN', :'role') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('CREATE ROLE %I LOGIN IN ROLE %I', :'login', :'role') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'login') \gexec
SET password_encryption = 'scram-sha-256';
ALTER ROLE :"login" PASSWORD :'password';
SQL
done
