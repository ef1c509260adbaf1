#!/usr/bin/env bash
# Command 1: set up everything attune needs on this machine (installing and starting PostgreSQL
# and RabbitMQ where they are missing), build, start attune (api + executor + 2 workers, packs
# registered) in the background, and run core.echo through the API.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_rust
ensure_tools
ensure_services
mkdir -p .attune

log "building"
cargo build --workspace --bins

if [ -f .attune/up.pid ] && kill -0 "$(cat .attune/up.pid)" 2>/dev/null; then
    log "stopping the attune started earlier (pid $(cat .attune/up.pid))"
    kill "$(cat .attune/up.pid)"
    while kill -0 "$(cat .attune/up.pid)" 2>/dev/null; do sleep 0.1; done
fi

export ATTUNE_API_ADDR=${ATTUNE_API_ADDR:-127.0.0.1:8080}
export ATTUNE_API_URL=${ATTUNE_API_URL:-http://$ATTUNE_API_ADDR}
export ATTUNE_PACKS_DIR=${ATTUNE_PACKS_DIR:-$PWD/packs}
log "starting attune (log: .attune/up.log)"
nohup target/debug/attune up --workers 2 >.attune/up.log 2>&1 &
echo $! >.attune/up.pid
for _ in $(seq 1 300); do
    curl -sf "$ATTUNE_API_URL/readyz" >/dev/null 2>&1 && break
    kill -0 "$(cat .attune/up.pid)" 2>/dev/null || { tail -n 30 .attune/up.log >&2; die "attune up exited"; }
    sleep 0.2
done
curl -sf "$ATTUNE_API_URL/readyz" >/dev/null || { tail -n 30 .attune/up.log >&2; die "attune did not become ready"; }

if [ ! -s .attune/token ]; then
    target/debug/attune token create --name quickstart --role admin >.attune/token
    chmod 600 .attune/token
fi
export ATTUNE_TOKEN=$(cat .attune/token)

log "running core.echo through the API"
target/debug/attune run core.echo message="Hello from attune" --wait

cat >&2 <<MSG

attune is running (api on $ATTUNE_API_URL, executor and 2 workers; pid $(cat .attune/up.pid)).
  export ATTUNE_TOKEN=\$(cat .attune/token)
  target/debug/attune run core.python_echo message=hi --wait
  target/debug/attune worker list
  make down        # stop it
MSG
