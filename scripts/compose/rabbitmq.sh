#!/usr/bin/env bash
# The broker's container command under compose: the server, then the services' users
# (scripts/broker-users.sh), then a mark the healthcheck waits for. SIGTERM stops the server.
# The image's entrypoint hands a command that is not `rabbitmq-server` over as root: the server
# and rabbitmqctl run as the image's `rabbitmq` user (gosu), whose Erlang cookie they share.
set -euo pipefail
as_rabbitmq() {
    if [ "$(id -u)" = 0 ] && command -v gosu >/dev/null; then gosu rabbitmq "$@"; else "$@"; fi
}
rm -f /tmp/attune-users-ready
# a data directory an earlier version (which ran the server as root) left root's: the image's own
# entrypoint gives it to rabbitmq the same way
if [ "$(id -u)" = 0 ]; then chown -R rabbitmq:rabbitmq /var/lib/rabbitmq; fi
as_rabbitmq rabbitmq-server &
server=$!
trap 'as_rabbitmq rabbitmqctl -q stop; wait "$server"; exit 0' TERM INT
as_rabbitmq rabbitmqctl -q await_startup
as_rabbitmq /attune/broker-users.sh
touch /tmp/attune-users-ready
wait "$server"
