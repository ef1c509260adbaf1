#!/usr/bin/env bash
# The broker's container command under compose: the server, then the services' users
# (scripts/broker-users.sh), then a mark the healthcheck waits for. SIGTERM stops the server.
set -euo pipefail
rm -f /tmp/attune-users-ready
rabbitmq-server &
server=$!
trap 'rabbitmqctl -q stop; wait "$server"; exit 0' TERM INT
rabbitmqctl -q await_startup
/attune/broker-users.sh
touch /tmp/attune-users-ready
wait "$server"
