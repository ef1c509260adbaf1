#!/usr/bin/env bash
# Command 1: set up everything attune needs on this machine (installing and starting PostgreSQL
# and RabbitMQ where they are missing), build, migrate, start attune (api + executor + 2 workers,
# each as its own database login and broker user, packs registered) in the background, and run
# core.echo through the API.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_rust
ensure_tools
ensure_services
mkdir -p .attune
# (the actions' users must not read the credentials, the key, the token or the logs)
chmod 700 .attune

log "building"
cargo build --workspace --bins

# what an earlier run started (this script's services, or an `attune up` of an older version)
stop_started || true

# The schema, changed by its owner alone; then each service logs in as its own login (database)
# and its own user (broker), with random passwords kept in .attune/credentials (0600).
log "migrating the database (attune migrate, as $ATTUNE_DB_USER)"
target/debug/attune migrate
ensure_service_logins
# a worker's login serves only the runtimes its owner grants it (attune worker-login)
target/debug/attune worker-login allow attune_worker_login shell python builtin http >/dev/null
log "creating the broker's users (vhost $ATTUNE_VHOST)"
ensure_broker_users

export ATTUNE_API_ADDR=${ATTUNE_API_ADDR:-127.0.0.1:8080}
export ATTUNE_API_URL=${ATTUNE_API_URL:-http://$ATTUNE_API_ADDR}
export ATTUNE_PACKS_DIR=${ATTUNE_PACKS_DIR:-$PWD/packs}
export ATTUNE_SECRETS_KEY_FILE=${ATTUNE_SECRETS_KEY_FILE:-$PWD/.attune/secrets.key}
# workers run as root and each action as a user id of its own, never as root or as this user
plan_action_users
db_url() { echo "postgres://attune_$1_login:$2@$PGHOST_ADDR:$PGPORT/$ATTUNE_DB_NAME"; }
mq_url() { echo "amqp://attune-$1:$2@127.0.0.1:$AMQP_PORT/$ATTUNE_VHOST"; }
start() { # name binary service db-password mq-password [VAR=value ...]
    local name=$1 binary=$2 service=$3 db=$4 mq=$5
    shift 5
    env DATABASE_URL="$(db_url "$service" "$db")" AMQP_URL="$(mq_url "$service" "$mq")" "$@" \
        nohup "target/debug/$binary" >".attune/$name.log" 2>&1 &
    echo $! >".attune/$name.pid"
}
log "starting attune: executor, 2 workers, api (logs: .attune/*.log)"
# every service serves its metrics (ops/prometheus/prometheus.yml scrapes these): the API's on
# its own address, the executor's and each worker's on ATTUNE_METRICS_ADDR
METRICS_HOST=${ATTUNE_METRICS_HOST:-127.0.0.1}
start executor attune-executor executor "$ATTUNE_DB_EXECUTOR_PASSWORD" "$ATTUNE_MQ_EXECUTOR_PASSWORD" \
    ATTUNE_METRICS_ADDR="$METRICS_HOST:9101"
for worker in 1:9102 2:9103; do
    i=${worker%%:*}
    start_as_root "worker-$i" attune-worker DATABASE_URL="$(db_url worker "$ATTUNE_DB_WORKER_PASSWORD")" \
        AMQP_URL="$(mq_url worker "$ATTUNE_MQ_WORKER_PASSWORD")" ATTUNE_WORKER_NAME="local-$i" \
        ATTUNE_METRICS_ADDR="$METRICS_HOST:${worker##*:}"
done
start api attune-api api "$ATTUNE_DB_API_PASSWORD" "$ATTUNE_MQ_API_PASSWORD"
for _ in $(seq 1 300); do
    curl -sf "$ATTUNE_API_URL/readyz" >/dev/null 2>&1 && break
    for pidfile in .attune/*.pid; do
        ps -p "$(cat "$pidfile")" >/dev/null 2>&1 || { tail -n 30 ".attune/$(basename "$pidfile" .pid).log" >&2; die "$(basename "$pidfile" .pid) exited"; }
    done
    sleep 0.2
done
curl -sf "$ATTUNE_API_URL/readyz" >/dev/null || { tail -n 30 .attune/api.log >&2; die "attune did not become ready"; }

if [ ! -s .attune/token ]; then
    (umask 077; target/debug/attune token create --name quickstart --role admin >.attune/token)
fi
chmod 600 .attune/token
export ATTUNE_TOKEN=$(cat .attune/token)
# for a shell of the operator's: `. .attune/env` (the CLI, psql and `attune token create`, which
# writes to the database as its owner)
(umask 077; cat >.attune/env <<ENV
export ATTUNE_API_URL=$ATTUNE_API_URL
export ATTUNE_TOKEN=$ATTUNE_TOKEN
export DATABASE_URL=$DATABASE_URL
export PGHOST=$PGHOST_ADDR PGPORT=$PGPORT PGUSER=$ATTUNE_DB_USER PGPASSWORD=$ATTUNE_DB_PASSWORD PGDATABASE=$ATTUNE_DB_NAME
export ATTUNE_PACKS_DIR=$ATTUNE_PACKS_DIR
ENV
)

log "running core.echo through the API"
target/debug/attune run core.echo message="Hello from attune" --wait

cat >&2 <<MSG

attune is running (api on $ATTUNE_API_URL, executor and 2 workers; pids in .attune/*.pid), each
service logged into PostgreSQL and RabbitMQ as its own user (passwords in .attune/credentials).
The workers run as root, each action as a user id of its own; packs are in $ATTUNE_PACKS_DIR.
  . .attune/env    # ATTUNE_TOKEN, DATABASE_URL and PG* for the CLI and psql
  target/debug/attune run core.python_echo message=hi --wait
  target/debug/attune worker list
  metrics: $ATTUNE_API_URL/metrics, the executor's on :9101, the workers' on :9102 and :9103
  (ops/prometheus/prometheus.yml scrapes them all)
  make down        # stop it
MSG
