#!/usr/bin/env bash
# A PostgreSQL primary and its synchronous streaming standby on this machine, for the switchover
# test (issue 36): the primary on 127.0.0.1:5695, the standby on 127.0.0.1:5696, their data under
# $ATTUNE_PG_STANDBY_DIR (/var/tmp/attune-pg), run as the postgres user with Debian's
# PostgreSQL 15. It leaves the machine's own PostgreSQL (5432) alone. Needs root.
#
#   scripts/test-pg-standby.sh start       make the pair (idempotent: a pair already streaming
#                                          synchronously is kept; anything else is made afresh)
#   scripts/test-pg-standby.sh stop        stop both servers and remove their data
#   scripts/test-pg-standby.sh switchover  stop the primary (fast) and promote the standby, waiting
#                                          until it takes writes
#   scripts/test-pg-standby.sh urls        the DATABASE_URL of the pair (both hosts, read-write)
#   scripts/test-pg-standby.sh standby-stop   stop the standby: every commit on the primary waits
#                                             for it (synchronous replication), reads go on
#   scripts/test-pg-standby.sh standby-start  start it again: the commits that waited complete
#
# The primary has what the tests need, made the way scripts/lib.sh makes it on the machine's own
# server: the attune role (owner, CREATEDB) and database, the services' group roles, the tests'
# service logins. The standby is a base backup of it and replays everything after, so the
# promoted standby has the same.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${ATTUNE_PG_STANDBY_DIR:-/var/tmp/attune-pg}
BIN=/usr/lib/postgresql/15/bin
PRIMARY_PORT=5695
STANDBY_PORT=5696
# the standby's name for synchronous_standby_names (its application_name when it streams)
STANDBY_NAME=attune_standby

[ "$(id -u)" = 0 ] || { echo "test-pg-standby.sh needs root (it runs the servers as the postgres user)" >&2; exit 1; }
[ -x "$BIN/postgres" ] || { echo "PostgreSQL 15 is not installed in $BIN (apt-get install postgresql-15)" >&2; exit 1; }

. scripts/lib.sh

as_postgres() { (cd / && runuser -u postgres -- "$@"); }
# psql as the superuser on one of the pair's servers (over its socket in /var/run/postgresql)
psql_on() { local port=$1; shift; as_postgres "$BIN/psql" -X -p "$port" -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
running() { as_postgres "$BIN/pg_ctl" -D "$BASE/$1" status >/dev/null 2>&1; }
ctl() { local node=$1; shift; as_postgres "$BIN/pg_ctl" -D "$BASE/$node" -l "$BASE/$node.log" "$@"; }

# Waits (at most $3 s) until the query $2 on port $1 answers "t".
wait_true() {
    local i
    for i in $(seq 1 $(($3 * 10))); do
        [ "$(psql_on "$1" -c "$2" 2>/dev/null)" = t ] && return 0
        sleep 0.1
    done
    echo "port $1: still not true after $3 s: $2" >&2
    return 1
}

# Whether the pair is as `start` makes it: the primary writable, the standby streaming from it
# synchronously.
healthy() {
    running primary && running standby || return 1
    [ "$(psql_on $PRIMARY_PORT -c 'SELECT NOT pg_is_in_recovery()' 2>/dev/null)" = t ] || return 1
    [ "$(psql_on $PRIMARY_PORT -c "SELECT EXISTS (SELECT FROM pg_stat_replication
        WHERE application_name = '$STANDBY_NAME' AND state = 'streaming' AND sync_state = 'sync')" 2>/dev/null)" = t ]
}

stop_all() {
    local node
    # (immediate: no shutdown checkpoint, the data goes anyway)
    for node in primary standby; do
        if running "$node"; then ctl "$node" stop -m immediate -w >/dev/null; fi
    done
    rm -rf "$BASE"
}

start_pair() {
    if healthy; then
        echo "PostgreSQL pair up: primary 127.0.0.1:$PRIMARY_PORT, standby 127.0.0.1:$STANDBY_PORT (sync)" >&2
        return 0
    fi
    # anything else (half made, or after a switchover) is made afresh
    stop_all
    mkdir -p "$BASE"
    chown postgres:postgres "$BASE"
    chmod 700 "$BASE"
    as_postgres "$BIN/initdb" -D "$BASE/primary" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
        -E UTF8 --locale=C.UTF-8 --no-sync >"$BASE/initdb.log"
    # the superuser over the socket (as the postgres user); the services and the tests with
    # passwords over TCP; the standby streams as the replicator role (loopback only, a test pair)
    cat >"$BASE/primary/pg_hba.conf" <<EOF
local all all peer
host replication replicator 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
EOF
    cat >>"$BASE/primary/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PRIMARY_PORT
unix_socket_directories = '/var/run/postgresql'
max_connections = 200
wal_level = replica
max_wal_senders = 4
wal_keep_size = 256MB
hot_standby = on
# a commit answers once the standby has flushed it too (synchronous_standby_names, set on the
# primary alone once the standby streams: see below); the standby's own copy of this file has
# none, so that once promoted it does not wait for a standby it does not have
synchronous_commit = on
EOF
    ctl primary start -w >/dev/null
    # the roles and database as on the machine's own server (scripts/lib.sh), on this port
    (
        export PGPORT=$PRIMARY_PORT
        # (lib.sh's own first tries TCP as postgres, where this pair asks for a password)
        psql_admin() { as_postgres "$BIN/psql" -X -p "$PGPORT" -d postgres -v ON_ERROR_STOP=1 -q "$@"; }
        ensure_credentials
        ensure_database
        ensure_test_logins
    )
    psql_on $PRIMARY_PORT -c "CREATE ROLE replicator LOGIN REPLICATION" >/dev/null
    as_postgres "$BIN/pg_basebackup" -w -h 127.0.0.1 -p $PRIMARY_PORT -U replicator -D "$BASE/standby" \
        --wal-method=stream --checkpoint=fast --no-sync >/dev/null
    cat >>"$BASE/standby/postgresql.conf" <<EOF
port = $STANDBY_PORT
primary_conninfo = 'host=127.0.0.1 port=$PRIMARY_PORT user=replicator application_name=$STANDBY_NAME'
EOF
    as_postgres touch "$BASE/standby/standby.signal"
    ctl standby start -w >/dev/null
    psql_on $PRIMARY_PORT -c "ALTER SYSTEM SET synchronous_standby_names = '$STANDBY_NAME'" >/dev/null
    psql_on $PRIMARY_PORT -c "SELECT pg_reload_conf()" >/dev/null
    wait_true $PRIMARY_PORT "SELECT EXISTS (SELECT FROM pg_stat_replication
        WHERE application_name = '$STANDBY_NAME' AND state = 'streaming' AND sync_state = 'sync')" 30
    echo "PostgreSQL pair up: primary 127.0.0.1:$PRIMARY_PORT, standby 127.0.0.1:$STANDBY_PORT (sync)" >&2
}

case ${1:-start} in
start)
    start_pair
    ;;
stop)
    stop_all
    ;;
switchover)
    healthy || { echo "the pair is not up and streaming synchronously: run start first" >&2; exit 1; }
    # a fast stop ends every session and, before it exits, sends the standby all the WAL it wrote
    ctl primary stop -m fast -w >/dev/null
    ctl standby promote -w >/dev/null
    wait_true $STANDBY_PORT "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'" 60
    echo "switched over: 127.0.0.1:$STANDBY_PORT is the primary; 127.0.0.1:$PRIMARY_PORT is stopped" >&2
    ;;
standby-stop)
    ctl standby stop -m fast -w >/dev/null
    ;;
standby-start)
    ctl standby start -w >/dev/null
    wait_true $PRIMARY_PORT "SELECT EXISTS (SELECT FROM pg_stat_replication
        WHERE application_name = '$STANDBY_NAME' AND state = 'streaming' AND sync_state = 'sync')" 30
    ;;
urls)
    ensure_credentials >/dev/null
    echo "postgres://$ATTUNE_DB_USER:$ATTUNE_DB_PASSWORD@127.0.0.1:$PRIMARY_PORT,127.0.0.1:$STANDBY_PORT/$ATTUNE_DB_NAME?target_session_attrs=read-write"
    ;;
*)
    echo "usage: $0 start|stop|switchover|urls|standby-stop|standby-start" >&2
    exit 2
    ;;
esac
