#!/usr/bin/env bash
# Writes `.env` for docker-compose.yml (mode 0600): a random password for the database's owner,
# each service's database login, the broker's administrator and each service's broker user.
# Keeps an existing `.env` (passwords are applied when the volumes are made).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -e .env ] && { echo ".env exists: kept" >&2; exit 0; }
(umask 077
 for name in POSTGRES_PASSWORD POSTGRES_API_PASSWORD POSTGRES_EXECUTOR_PASSWORD \
     POSTGRES_WORKER_SHELL_PASSWORD POSTGRES_WORKER_PYTHON_PASSWORD RABBITMQ_PASSWORD RABBITMQ_API_PASSWORD \
     RABBITMQ_EXECUTOR_PASSWORD RABBITMQ_WORKER_SHELL_PASSWORD RABBITMQ_WORKER_PYTHON_PASSWORD; do
     echo "$name=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
 done >.env)
echo "wrote .env (0600)" >&2
