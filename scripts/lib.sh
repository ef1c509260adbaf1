# Shared set-up steps for quickstart.sh and test.sh. Each step checks first and does nothing
# where the thing is already there, so running it on a machine that has everything is harmless.

ATTUNE_DB_USER=${ATTUNE_DB_USER:-attune}
ATTUNE_DB_NAME=${ATTUNE_DB_NAME:-attune}
# Passwords: random, made once per checkout into .attune/credentials (mode 0600) and kept there;
# one set in the environment wins (ensure_credentials).
CREDENTIALS=.attune/credentials
CREDENTIAL_NAMES="ATTUNE_TEST_LOGIN_PASSWORD ATTUNE_DB_PASSWORD ATTUNE_DB_API_PASSWORD ATTUNE_DB_EXECUTOR_PASSWORD ATTUNE_DB_WORKER_PASSWORD ATTUNE_MQ_API_PASSWORD ATTUNE_MQ_EXECUTOR_PASSWORD ATTUNE_MQ_WORKER_PASSWORD"
PGHOST_ADDR=${PGHOST_ADDR:-127.0.0.1}
PGPORT=${PGPORT:-5432}
AMQP_PORT=${AMQP_PORT:-5672}

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else die "need root for: $*"; fi
}

apt_install() {
    command -v apt-get >/dev/null || die "$* missing and this is not a Debian-like system: install $* yourself"
    log "installing $* (apt-get)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

random_secret() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }

# Makes .attune/credentials (0600) with a random password for each name that has none yet, and
# exports each (a value already in the environment wins).
ensure_credentials() {
    mkdir -p .attune
    (umask 077; touch "$CREDENTIALS")
    chmod 600 "$CREDENTIALS"
    local name value
    for name in $CREDENTIAL_NAMES; do
        grep -q "^$name=" "$CREDENTIALS" || echo "$name=$(random_secret)" >>"$CREDENTIALS"
    done
    while IFS='=' read -r name value; do
        [ -n "$name" ] && [ -z "${!name:-}" ] && export "$name=$value"
    done <"$CREDENTIALS"
    # the key that seals secrets (ATTUNE_SECRETS_KEY_FILE), made once
    if [ ! -s .attune/secrets.key ]; then
        (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >.attune/secrets.key)
    fi
    chmod 600 .attune/secrets.key
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_port() { # host port what seconds
    local i
    for i in $(seq 1 $(( $4 * 5 ))); do port_open "$1" "$2" && return 0; sleep 0.2; done
    die "$3 is not listening on $1:$2 after $4 s"
}

ensure_rust() {
    command -v cargo >/dev/null || die "cargo not found: install Rust 1.94 or newer (https://rustup.rs), then run this again"
}

# What the build and the tests use that a fresh Debian server lacks; each is checked by the
# command that needs it and installed (apt) only when missing.
ensure_tools() {
    local missing=()
    command -v cc >/dev/null || missing+=(gcc libc6-dev)          # Rust links with cc; ring compiles C
    command -v make >/dev/null || missing+=(make)                 # `make test`, `make bench`, ...
    command -v curl >/dev/null || missing+=(curl)                 # readiness checks and the README's examples
    command -v python3 >/dev/null || missing+=(python3)           # the OpenAPI fuzzer, pyenv-free actions
    command -v pkill >/dev/null || missing+=(procps)              # kill/pkill in scripts and tests
    [ -e /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)  # crates.io, PyPI over TLS
    if [ ${#missing[@]} -gt 0 ]; then
        log "missing build and test tools: ${missing[*]}"
        apt_install "${missing[@]}"
    fi
}

ensure_postgres() {
    if ! command -v psql >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
        if ! port_open "$PGHOST_ADDR" "$PGPORT"; then apt_install postgresql; fi
    fi
    if ! port_open "$PGHOST_ADDR" "$PGPORT"; then
        log "starting PostgreSQL"
        if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
            local version; version=$(ls /etc/postgresql | sort -V | tail -n1)
            as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || as_root service postgresql start
        else
            as_root service postgresql start
        fi
        wait_port "$PGHOST_ADDR" "$PGPORT" PostgreSQL 30
    fi
}

ensure_rabbitmq() {
    if ! port_open 127.0.0.1 "$AMQP_PORT"; then
        command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
        if ! port_open 127.0.0.1 "$AMQP_PORT"; then
            log "starting RabbitMQ"
            as_root rabbitmq-server -detached || as_root service rabbitmq-server start
            wait_port 127.0.0.1 "$AMQP_PORT" RabbitMQ 90
        fi
    fi
}

# Runs psql as a PostgreSQL superuser: over TCP as 'postgres' (trust set-ups), else as the
# postgres system user over the socket (Debian's default peer authentication).
psql_admin() {
    if psql -h "$PGHOST_ADDR" -p "$PGPORT" -U postgres -d postgres -tAc 'SELECT 1' >/dev/null 2>&1 </dev/null; then
        psql -h "$PGHOST_ADDR" -p "$PGPORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q "$@"
    elif [ "$(id -u)" = 0 ]; then
        (cd / && runuser -u postgres -- psql -p "$PGPORT" -d postgres -v ON_ERROR_STOP=1 -q "$@")
    else
        (cd / && sudo -u postgres psql -p "$PGPORT" -d postgres -v ON_ERROR_STOP=1 -q "$@")
    fi
}

# The attune role logs in with its password over TCP (scram-sha-256), as on a stock Debian, also
# where the machine trusts local TCP connections: one line for that role alone goes first in
# pg_hba.conf (other roles keep what the machine has), then PostgreSQL reloads.
ensure_password_auth() {
    local hba
    hba=$(psql_admin -tAc 'SHOW hba_file') || return 0
    if ! as_root grep -Eq "^host[[:space:]]+all[[:space:]]+$ATTUNE_DB_USER[[:space:]]+127\.0\.0\.1/32[[:space:]]+scram-sha-256" "$hba"; then
        log "PostgreSQL: the '$ATTUNE_DB_USER' role logs in with its password (scram-sha-256) over TCP ($hba)"
        as_root sed -i "1i host all $ATTUNE_DB_USER 127.0.0.1/32 scram-sha-256\nhost all $ATTUNE_DB_USER ::1/128 scram-sha-256" "$hba"
        psql_admin -c 'SELECT pg_reload_conf()' >/dev/null
    fi
}

# Sets a role's password (scram-sha-256), passing it to psql on stdin (printf is the shell's own):
# never on a command line, where `ps` and sudo's log would show it.
set_password() { # role password
    printf "SET password_encryption = 'scram-sha-256'; ALTER ROLE %s PASSWORD '%s';\n" "$1" "$2" | psql_admin >/dev/null
}

# The attune role owns the schema and runs the migrations (`attune migrate`); the services' group
# roles (attune_api, attune_executor, attune_worker) are made here, by the superuser, so that the
# owner needs no CREATEROLE (which on PostgreSQL 15 is nearly a superuser's power).
ensure_database() {
    ensure_password_auth
    if PGPASSWORD=$ATTUNE_DB_PASSWORD psql -h "$PGHOST_ADDR" -p "$PGPORT" -U "$ATTUNE_DB_USER" -d "$ATTUNE_DB_NAME" -tAc 'SELECT 1' >/dev/null 2>&1 </dev/null; then
        ensure_group_roles
        return 0
    fi
    log "creating PostgreSQL role and database '$ATTUNE_DB_NAME'"
    psql_admin -c "DO \$\$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ATTUNE_DB_USER') THEN
            CREATE ROLE $ATTUNE_DB_USER LOGIN CREATEDB;
        END IF; END \$\$;"
    set_password "$ATTUNE_DB_USER" "$ATTUNE_DB_PASSWORD"
    if [ -z "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$ATTUNE_DB_NAME'")" ]; then
        psql_admin -c "CREATE DATABASE $ATTUNE_DB_NAME OWNER $ATTUNE_DB_USER"
    fi
    ensure_group_roles
}

ensure_group_roles() {
    psql_admin -c "DO \$\$ DECLARE r text; BEGIN
        FOREACH r IN ARRAY ARRAY['attune_api', 'attune_executor', 'attune_worker'] LOOP
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            END IF;
        END LOOP; END \$\$;"
    # an earlier version of this script gave the owner CREATEROLE: taken back
    if [ "$(psql_admin -tAc "SELECT rolcreaterole FROM pg_roles WHERE rolname = '$ATTUNE_DB_USER'")" = t ]; then
        log "PostgreSQL: the '$ATTUNE_DB_USER' role no longer needs CREATEROLE: taken back"
        psql_admin -c "ALTER ROLE $ATTUNE_DB_USER NOCREATEROLE" >/dev/null
    fi
}

# The system tests' service logins (attune_testkit::SERVICE_LOGINS: each service of a test system
# logs in as its own), and the right of the tests' admin (the owner) to end the services'
# sessions, which the chaos tests do (pg_signal_backend). For test machines only.
ensure_test_logins() {
    local login group
    for pair in attune_test_api:attune_api attune_test_executor:attune_executor \
        attune_test_worker:attune_worker attune_test_worker_b:attune_worker; do
        login=${pair%%:*} group=${pair#*:}
        psql_admin -c "DO \$\$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$login') THEN
                CREATE ROLE $login LOGIN IN ROLE $group;
            END IF; END \$\$;"
        # a password of this checkout's (.attune/credentials), not one anybody knows: these
        # logins reach every database of the cluster their group roles are granted in
        set_password "$login" "$ATTUNE_TEST_LOGIN_PASSWORD"
    done
    psql_admin -c "GRANT pg_signal_backend TO $ATTUNE_DB_USER" >/dev/null
}

# The services' own logins, each a member of the group role the migrations make (run after
# `attune migrate`): attune_api_login, attune_executor_login, attune_worker_login, with the
# passwords of .attune/credentials.
ensure_service_logins() {
    local service password
    for service in api executor worker; do
        password=$(eval "echo \$ATTUNE_DB_$(echo "$service" | tr a-z A-Z)_PASSWORD")
        psql_admin -c "DO \$\$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'attune_${service}_login') THEN
                CREATE ROLE attune_${service}_login LOGIN IN ROLE attune_${service};
            END IF; END \$\$;"
        set_password "attune_${service}_login" "$password"
    done
}

# The broker's users, one per service (scripts/broker-users.sh), with the passwords of
# .attune/credentials.
ATTUNE_VHOST=${ATTUNE_VHOST:-attune}
ensure_broker_users() {
    export ATTUNE_VHOST ATTUNE_MQ_API_PASSWORD ATTUNE_MQ_EXECUTOR_PASSWORD ATTUNE_MQ_WORKER_PASSWORD
    # the passwords go in the environment, not on sudo's command line (which its log keeps)
    if [ "$(id -u)" = 0 ]; then
        "$PWD/scripts/broker-users.sh"
    else
        sudo --preserve-env=ATTUNE_VHOST,ATTUNE_MQ_API_PASSWORD,ATTUNE_MQ_EXECUTOR_PASSWORD,ATTUNE_MQ_WORKER_PASSWORD \
            "$PWD/scripts/broker-users.sh"
    fi
}

# The dashboard's browser tests drive Debian's chromium through chromedriver (no download at run time).
ensure_chromium() {
    if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
        apt_install chromium chromium-driver
    fi
}

# schemathesis (the OpenAPI fuzzer of the `fuzz` system test), in a virtual environment under
# target/ so that nothing is installed system-wide; kept between runs.
SCHEMATHESIS=target/fuzz/venv/bin/schemathesis
ensure_schemathesis() {
    [ -x "$SCHEMATHESIS" ] && return 0
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        log "installing python3-venv (apt), for the OpenAPI fuzzer's virtual environment"
        apt_install python3-venv
    fi
    log "installing schemathesis 4.32.5 (PyPI) into target/fuzz/venv"
    python3 -m venv target/fuzz/venv
    target/fuzz/venv/bin/pip install --quiet 'schemathesis==4.32.5'
}

# sqlx-cli (the `sqlx migrate run` of the quick reference, which the `migrations` system test
# runs), built once into target/sqlx-cli and kept between runs.
SQLX_CLI=target/sqlx-cli/bin/sqlx
ensure_sqlx_cli() {
    [ -x "$SQLX_CLI" ] && return 0
    log "installing sqlx-cli 0.9.0 into target/sqlx-cli (once; a few minutes)"
    cargo install sqlx-cli --version 0.9.0 --locked --no-default-features --features postgres,rustls \
        --root target/sqlx-cli --quiet
}

# mdBook (the book in book/, `make docs`), built once into target/mdbook and kept.
MDBOOK=target/mdbook/bin/mdbook
ensure_mdbook() {
    [ -x "$MDBOOK" ] && return 0
    log "installing mdBook 0.4 into target/mdbook (once; a few minutes)"
    cargo install mdbook --version "~0.4.52" --locked --no-default-features --features search \
        --root target/mdbook --quiet
}

# Prometheus 2 (promtool for the alert rules' unit tests, the server for the system test that
# scrapes attune), Debian's package unpacked into target/prometheus: nothing installed, no
# service started. Kept between runs.
PROMETHEUS_DIR=target/prometheus
ensure_prometheus() {
    [ -x "$PROMETHEUS_DIR/usr/bin/promtool" ] && [ -x "$PROMETHEUS_DIR/usr/bin/prometheus" ] && return 0
    command -v apt-get >/dev/null || die "prometheus missing and this is not a Debian-like system: put promtool and prometheus in $PROMETHEUS_DIR/usr/bin"
    log "fetching Debian's prometheus package into $PROMETHEUS_DIR (unpacked, not installed)"
    mkdir -p "$PROMETHEUS_DIR"
    (cd "$PROMETHEUS_DIR" && rm -f prometheus_*.deb && { apt-get download prometheus >/dev/null 2>&1 || { as_root apt-get update -qq && apt-get download prometheus >/dev/null; }; } && dpkg-deb -x prometheus_*.deb . && rm -f prometheus_*.deb)
}

ensure_services() {
    ensure_credentials
    ensure_postgres
    ensure_rabbitmq
    ensure_database
    export DATABASE_URL=${DATABASE_URL:-postgres://$ATTUNE_DB_USER:$ATTUNE_DB_PASSWORD@$PGHOST_ADDR:$PGPORT/$ATTUNE_DB_NAME}
    export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f}
}

# The quickstart never runs an action as root, nor as the user whose checkout holds .attune/ (the
# owner's password, the secrets key, the admin token): its workers run as root (through sudo when
# this is not root) and each action as a user id of its own (ATTUNE_WORKER_ACTION_UIDS, the
# worker's default range). Those users must read the packs: a packs directory closed to them (a
# checkout under /root, or a home of mode 0750) is copied to ATTUNE_SHARED_PACKS, owned by this
# user and readable by all, copied over at each run (a pack added there stays), and becomes
# ATTUNE_PACKS_DIR.
ATTUNE_SHARED_PACKS=${ATTUNE_SHARED_PACKS:-/var/lib/attune/packs}
plan_action_users() {
    case "${ATTUNE_WORKER_ACTION_UIDS:-}" in
    off) die "ATTUNE_WORKER_ACTION_UIDS=off would run every action as the workers' user (root, or you, beside .attune/): the quickstart runs each as a user id of its own; unset it, or give a range (<first>-<last>)" ;;
    esac
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "the workers must run as root, so that each action runs as a user id of its own and not as you (who can read .attune/): run this as root, or install sudo"
        log "the workers run as root (through sudo), so that each action runs as a user id of its own and not as you (who can read .attune/)"
        sudo true || die "sudo refused: the workers must run as root (run this as root, or with sudo rights)"
    fi
    if ! as_root runuser -u nobody -- test -r "$ATTUNE_PACKS_DIR/core/actions/echo.sh" 2>/dev/null; then
        case "$ATTUNE_SHARED_PACKS" in
        /?*/?*) ;;
        *) die "ATTUNE_SHARED_PACKS=$ATTUNE_SHARED_PACKS: expected a directory two levels or more below /" ;;
        esac
        log "$ATTUNE_PACKS_DIR is closed to other users (a checkout under /root, or a home of mode 0750): the packs are copied to $ATTUNE_SHARED_PACKS (ATTUNE_PACKS_DIR from here on), where the actions' users may read them"
        as_root mkdir -p "$ATTUNE_SHARED_PACKS"
        as_root cp -R "$ATTUNE_PACKS_DIR/." "$ATTUNE_SHARED_PACKS/"
        as_root chown -R "$(id -u):$(id -g)" "$ATTUNE_SHARED_PACKS"
        chmod -R u+rwX,go=rX "$ATTUNE_SHARED_PACKS"
        as_root chmod o+x "$(dirname "$ATTUNE_SHARED_PACKS")"
        as_root runuser -u nobody -- test -r "$ATTUNE_SHARED_PACKS/core/actions/echo.sh" \
            || die "other users cannot read $ATTUNE_SHARED_PACKS either (a directory above it is closed): set ATTUNE_SHARED_PACKS to a directory they can reach"
        export ATTUNE_PACKS_DIR=$ATTUNE_SHARED_PACKS
    fi
}

# Starts one of attune's binaries in the background as root (through sudo when this is not root),
# with PATH, LANG, this shell's ATTUNE_* and RUST_LOG settings but no password, and the extra
# VAR=value arguments; its pid (the binary's own, not sudo's) in .attune/<name>.pid.
start_as_root() { # name binary VAR=value ...
    local name=$1 binary=$2 settings=() variable
    shift 2
    for variable in $(compgen -e); do
        # (not the passwords ensure_credentials exports: a worker is given its own URLs)
        case $variable in *_PASSWORD) ;; ATTUNE_* | RUST_LOG) settings+=("$variable=${!variable}") ;; esac
    done
    rm -f ".attune/$name.pid"
    # the settings (the URLs hold passwords) go through a file of the user's (0600) that the root
    # shell reads and removes, never on a command line: sudo stays the worker's parent, and its
    # /proc/<pid>/cmdline is everyone's to read, the action users' too
    local settings_file
    settings_file=$(umask 077 && mktemp .attune/start.XXXXXX)
    for variable in "${settings[@]}" "$@"; do printf 'export %q\n' "$variable"; done >"$settings_file"
    as_root env -i PATH="$PATH" ${LANG:+LANG="$LANG"} bash -c '. "$1" && rm -f "$1" && echo $$ >"$0" && exec nohup "$2"' \
        ".attune/$name.pid" "$settings_file" "target/debug/$binary" >".attune/$name.log" 2>&1 </dev/null &
    local waited=0
    while [ ! -s ".attune/$name.pid" ] && [ $waited -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
    [ -s ".attune/$name.pid" ] || die "$name did not start (.attune/$name.log)"
}

# Stops each attune service a quickstart started (.attune/*.pid), as root where it runs as root;
# a pid that is no longer one of attune's binaries is left alone. Says whether any was running.
stop_started() {
    local pidfile pid stopped=1
    for pidfile in .attune/*.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        case "$(ps -o comm= -p "$pid" 2>/dev/null)" in
        attune*)
            log "stopping $(basename "$pidfile" .pid) (pid $pid)"
            if [ "$(ps -o uid= -p "$pid" | tr -d ' ')" = "$(id -u)" ]; then kill "$pid"; else as_root kill "$pid"; fi
            while ps -p "$pid" >/dev/null 2>&1; do sleep 0.1; done
            stopped=0
            ;;
        esac
        rm -f "$pidfile"
    done
    return $stopped
}
