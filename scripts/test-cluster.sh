#!/usr/bin/env bash
# A RabbitMQ cluster of three nodes on this machine, for the cluster tests (issue 36):
# attune-a, attune-b and attune-c @localhost, listening on 127.0.0.1:5691, 5692 and 5693
# (distribution on 25691..25693), their data under $ATTUNE_CLUSTER_DIR (/var/tmp/attune-cluster).
# It leaves the machine's own broker (rabbit@localhost, 5672) alone; the nodes share its Erlang
# cookie. Needs root and Debian's rabbitmq-server.
#
#   scripts/test-cluster.sh start         start the three nodes and join them (idempotent)
#   scripts/test-cluster.sh stop          stop them, and remove their data
#   scripts/test-cluster.sh stop-node b   stop one node's broker (its Erlang node stays up)
#   scripts/test-cluster.sh start-node b  start it again
#   scripts/test-cluster.sh urls          the AMQP_URL of the cluster (the three nodes)
set -euo pipefail

BASE=${ATTUNE_CLUSTER_DIR:-/var/tmp/attune-cluster}
NODES="a b c"
RABBIT=/usr/lib/rabbitmq/bin

port() { case $1 in a) echo 5691 ;; b) echo 5692 ;; c) echo 5693 ;; *) echo "no node $1" >&2; exit 2 ;; esac; }
name() { echo "attune-$1@localhost"; }
ctl() { local n=$1; shift; HOME=/var/lib/rabbitmq "$RABBIT/rabbitmqctl" -q -n "$(name "$n")" "$@"; }

[ "$(id -u)" = 0 ] || { echo "test-cluster.sh needs root (it runs the nodes as the rabbitmq user)" >&2; exit 1; }
[ -x "$RABBIT/rabbitmq-server" ] || { echo "rabbitmq-server is not installed (apt-get install rabbitmq-server)" >&2; exit 1; }

# the node's environment: its own name, ports, data, log and configuration
node_env() {
    local n=$1 dir=$BASE/$1
    echo RABBITMQ_NODENAME="$(name "$n")" RABBITMQ_NODE_PORT="$(port "$n")" \
        RABBITMQ_DIST_PORT="$(( $(port "$n") + 20000 ))" RABBITMQ_MNESIA_BASE="$dir/mnesia" \
        RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_CONF_ENV_FILE="$dir/env.conf" \
        RABBITMQ_PID_FILE="$dir/pid" HOME=/var/lib/rabbitmq ERL_EPMD_ADDRESS=127.0.0.1
}

running() { ctl "$1" ping >/dev/null 2>&1; }

start_node() {
    local n=$1 dir=$BASE/$1
    if running "$n"; then
        ctl "$n" start_app >/dev/null 2>&1 || true
        return 0
    fi
    mkdir -p "$dir/mnesia" "$dir/log"
    printf 'listeners.tcp.local = 127.0.0.1:%s\n' "$(port "$n")" >"$dir/rabbitmq.conf"
    echo '[].' >"$dir/enabled_plugins"
    # (not the machine's env file: it names the machine's own node)
    : >"$dir/env.conf"
    chown -R rabbitmq:rabbitmq "$dir"
    # shellcheck disable=SC2046
    runuser -u rabbitmq -- env $(node_env "$n") ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        "$RABBIT/rabbitmq-server" -detached
    local i
    for i in $(seq 1 120); do running "$n" && break; sleep 0.5; done
    ctl "$n" await_startup >/dev/null
}

case ${1:-start} in
start)
    for n in $NODES; do start_node "$n"; done
    for n in b c; do
        if ! ctl a cluster_status 2>/dev/null | grep -q "$(name "$n")"; then
            # (a joining node's CLI warns of tables it makes before it runs: kept in its log dir)
            { ctl "$n" stop_app && ctl "$n" reset && ctl "$n" join_cluster "$(name a)" && ctl "$n" start_app; } \
                >>"$BASE/$n/log/join.log" 2>&1 || { cat "$BASE/$n/log/join.log" >&2; exit 1; }
        fi
    done
    echo "cluster up: $(name a) $(name b) $(name c)" >&2
    ;;
stop)
    # the nodes and their data (the next start makes a fresh cluster)
    for n in $NODES; do running "$n" && ctl "$n" stop >/dev/null 2>&1 || true; done
    rm -rf "$BASE"
    ;;
stop-node)
    ctl "${2:?which node}" stop_app
    ;;
start-node)
    ctl "${2:?which node}" start_app
    ctl "$2" await_startup >/dev/null
    ;;
urls)
    echo "amqp://guest:guest@127.0.0.1:5691/%2f,amqp://guest:guest@127.0.0.1:5692/%2f,amqp://guest:guest@127.0.0.1:5693/%2f"
    ;;
*)
    echo "usage: $0 start|stop|stop-node N|start-node N|urls" >&2
    exit 2
    ;;
esac
