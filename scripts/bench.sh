#!/usr/bin/env bash
# The full benchmark in one command (`make bench`): a release build, a fresh database
# (`attune_bench`, dropped and recreated) and broker namespace, `attune up --workers 2` on a free
# port, a token, then `attune-bench` with any arguments given here (default: every workload). It
# prints the table, writes docs/bench/results.json and docs/bench/latency-vs-load.svg (unless
# --json/--plot are given), and reports the CPU time attune, PostgreSQL and RabbitMQ used per
# completed execution over the whole run.
# `--workload history` (never in the default set) measures twice in one run, on the execution table
# as found and after loading `--history-rows N` (default 10,000,000) finished executions straight
# into the database; `--soak MINUTES [--rate R]` runs core.noop open loop (300/s by default) and
# prints every 30 s the rate and the execution table's rows and sizes, for attune started with short
# retention ages, which pass through to `attune up` from the environment (e.g.
# ATTUNE_RETENTION_COMPLETED=2m ATTUNE_RETENTION_FAILED=2m ATTUNE_HISTORY_INTERVAL_SECS=10).
# ATTUNE_BENCH_ATTUNE=path runs that `attune` binary instead of this tree's (an earlier build, for a
# before/after measured with the same attune-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_rust
ensure_services
log "building (release)"
cargo build --release -p attune-cli --bin attune -p attune-bench --bin attune-bench --quiet

bench_db=${ATTUNE_BENCH_DB:-attune_bench}
psql_admin -c "DROP DATABASE IF EXISTS $bench_db WITH (FORCE)" -c "CREATE DATABASE $bench_db OWNER $ATTUNE_DB_USER"
export DATABASE_URL=postgres://$ATTUNE_DB_USER:$ATTUNE_DB_PASSWORD@$PGHOST_ADDR:$PGPORT/$bench_db
# a broker vhost of its own (removed at the end with everything in it), where rabbitmqctl allows
if command -v rabbitmqctl >/dev/null && [ "$(id -u)" = 0 ] && rabbitmqctl -q add_vhost "attune-bench-$$" >/dev/null 2>&1; then
    bench_vhost=attune-bench-$$
    rabbitmqctl -q set_permissions -p "$bench_vhost" guest '.*' '.*' '.*' >/dev/null
    export AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/$bench_vhost
fi
export ATTUNE_MQ_NAMESPACE=bench$$
export ATTUNE_PACKS_DIR=$PWD/packs
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export ATTUNE_API_ADDR=127.0.0.1:$port ATTUNE_API_URL=http://127.0.0.1:$port
export RUST_LOG=${RUST_LOG:-info}
# the backlog workload's setting (200 × 1 s on 2 workers of concurrency 4, far past a 30 s TTL)
export ATTUNE_WORKER_CONCURRENCY=${ATTUNE_WORKER_CONCURRENCY:-4} ATTUNE_WORKER_QUEUE_TTL_SECS=${ATTUNE_WORKER_QUEUE_TTL_SECS:-30}

mkdir -p target/bench
log "starting attune (log: target/bench/up.log)"
attune_bin=${ATTUNE_BENCH_ATTUNE:-target/release/attune}
"$attune_bin" up --workers 2 >target/bench/up.log 2>&1 &
up=$!
cleanup() {
    kill "$up" 2>/dev/null || true
    wait "$up" 2>/dev/null || true
    if [ -n "${bench_vhost:-}" ]; then rabbitmqctl -q delete_vhost "$bench_vhost" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
for _ in $(seq 1 300); do
    curl -sf "$ATTUNE_API_URL/readyz" >/dev/null 2>&1 && break
    kill -0 "$up" 2>/dev/null || { tail -n 30 target/bench/up.log >&2; die "attune up exited"; }
    sleep 0.2
done
export ATTUNE_TOKEN=$("$attune_bin" token create --name bench --role admin --expires-in 1d)

# CPU seconds (user + system) of every process whose command line matches, from /proc.
cpu_of() {
    local pattern=$1 total=0 pid ticks
    for pid in $(pgrep -f "$pattern"); do
        ticks=$(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0)
        total=$((total + ticks))
    done
    echo "$total"
}
completed() { psql "$DATABASE_URL" -tAc "SELECT count(*) FROM execution WHERE status = 'completed'"; }
# (attune: `attune up` and its workers' action supervisors, `attune supervisor`, which are
# platform too; the actions' own processes are not counted)
snapshot() { echo "$(cpu_of 'attune (up|supervise)') $(cpu_of 'postgres') $(cpu_of 'beam.smp') $(completed)"; }

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--json docs/bench/results.json --plot docs/bench/latency-vs-load.svg)
# the results as JSON: where the arguments say, else target/bench/last.json (read for the floor)
results=target/bench/last.json
json_given=
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --json) results=${args[$((i + 1))]:-$results} json_given=1 ;;
        --json=*) results=${args[$i]#--json=} json_given=1 ;;
    esac
done
[ -n "$json_given" ] || args+=(--json "$results")
# each workload starts right after a checkpoint, as each run of the floor does (it checkpoints
# after creating its table), when the `postgres` login works over TCP (as the floor's does)
admin_url=postgres://postgres@$PGHOST_ADDR:$PGPORT/$bench_db
if psql "$admin_url" -tAc 'SELECT 1' >/dev/null 2>&1 </dev/null; then args+=(--admin-url "$admin_url"); fi
read -r a0 p0 r0 n0 <<<"$(snapshot)"
# the benchmark client shares the machine: its own CPU seconds (user and system) too, from the
# shell's accounting of its finished children
# (`times` in this shell itself: in a subshell it would count the subshell's children)
children_cpu() { tail -n 1 "$1" | awk '{ gsub(/[ms]/, " "); print 60 * $1 + $2 + 60 * $3 + $4 }'; }
times >target/bench/times.before
target/release/attune-bench "${args[@]}"
times >target/bench/times.after
client=$(awk -v a="$(children_cpu target/bench/times.before)" -v b="$(children_cpu target/bench/times.after)" 'BEGIN { print b - a }')
read -r a1 p1 r1 n1 <<<"$(snapshot)"
# (no CPU line after a history load or a soak: loaded rows no service ran, and rows retention
# deleted, make the count of completed executions say nothing of the run's work)
if python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if "history" in r or "soak" in r else 1)' "$results" 2>/dev/null; then n1=$n0; fi
hz=$(getconf CLK_TCK)
awk -v a="$((a1 - a0))" -v p="$((p1 - p0))" -v r="$((r1 - r0))" -v n="$((n1 - n0))" -v hz="$hz" -v client="$client" 'BEGIN {
    if (n == 0) exit
    printf "\nCPU per completed execution over the run (%d executions): attune %.2f ms, PostgreSQL %.2f ms, RabbitMQ %.2f ms, total %.2f ms; the benchmark client %.2f ms\n",
        n, 1000 * a / hz / n, 1000 * p / hz / n, 1000 * r / hz / n, 1000 * (a + p + r) / hz / n, 1000 * client / n }'

# The naive floor (../shared/floorbench), measured right after attune in the same sitting: its
# maximum rate (the ratio of attune's `core.noop` maximum rate to it), and its latency at each
# offered load attune was measured at (`rate` and `load` rows: the p99 ratio, and its curve drawn
# beside attune's in the plot). ATTUNE_BENCH_NO_FLOOR=1 leaves it out. It is built here when
# missing. It runs as the `postgres` superuser over TCP (it checkpoints), in the database
# `attune_floorbench`; where that login is refused, the ratios are left out.
floor_dir=${ATTUNE_FLOORBENCH_DIR:-../shared/floorbench}
plot=
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --plot) plot=${args[$((i + 1))]:-} ;;
        --plot=*) plot=${args[$i]#--plot=} ;;
    esac
done
attune_rate=$(python3 -c 'import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["results"] if r["workload"] == "core.noop, max rate"]
print(rows[0]["executions_per_second"] if rows else "")' "$results" 2>/dev/null || true)
# the offered rates of the open-loop rows, each one's p99 and how many seconds it ran (the floor
# runs as long: a p99 over a shorter window is less likely to contain one of the machine's disk
# stalls, and would flatter the floor)
open_loop=$(python3 -c 'import json, math, sys
rows = [r for r in json.load(open(sys.argv[1]))["results"]
        if r.get("extra", {}).get("offered_rate") and not r["workload"].startswith("core.echo")]
for r in sorted(rows, key=lambda r: r["extra"]["offered_rate"]):
    print(r["extra"]["offered_rate"], r["latency_ms"]["p99"], r["workload"].replace(" ", "_"), max(5, math.ceil(r["seconds"])))' "$results" 2>/dev/null || true)
floor() {
    (cd "$floor_dir" &&
        DATABASE_URL=postgres://postgres@$PGHOST_ADDR:$PGPORT/attune_floorbench \
        AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f \
        ./target/release/floorbench e2e qtype=quorum "$@" 2>&1) || true
}
if [ -z "${ATTUNE_BENCH_NO_FLOOR:-}" ] && { [ -n "$attune_rate" ] || [ -n "$open_loop" ]; } && [ -f "$floor_dir/Cargo.toml" ]; then
    cleanup # attune stops first: the floor gets the machine to itself, as attune had
    trap - EXIT
    if [ ! -x "$floor_dir/target/release/floorbench" ]; then
        log "building the floor ($floor_dir)"
        (cd "$floor_dir" && cargo build --release --quiet)
    fi
    psql_admin -c "CREATE DATABASE attune_floorbench" >/dev/null 2>&1 || true
    floor_json=$(dirname "$results")/floor.json
    points=()
    # (the same PostgreSQL and RabbitMQ as attune's run; the vhost of that run is gone)
    measured_rate=
    while read -r rate attune_p99 workload secs; do
        [ -n "$rate" ] || continue
        # (each offered rate once: the `rate` row and a `load` row may share one)
        if [ "$rate" != "$measured_rate" ]; then
            measured_rate=$rate
            log "the floor at $rate/s offered: floorbench e2e secs=$secs warm=2 qtype=quorum mode=rate rate=$rate"
            line=$(floor secs="$secs" warm=2 mode=rate rate="$rate" | grep -m1 'latency INSERT -> UPDATE succeeded committed' || true)
            p50=$(sed -n 's/.* p50=\([0-9.]*\)ms.*/\1/p' <<<"$line")
            p99=$(sed -n 's/.* p99=\([0-9.]*\)ms.*/\1/p' <<<"$line")
            [ -z "$p99" ] || points+=("{\"offered_rate\": $rate, \"p50\": $p50, \"p99\": $p99}")
        fi
        if [ -z "$p99" ]; then
            log "the floor did not report its latency at $rate/s"
            continue
        fi
        awk -v r="$rate" -v a="$attune_p99" -v f="$p99" -v w="${workload//_/ }" 'BEGIN {
            printf "p99 at %s/s offered (%s): attune %.1f ms, the naive floor %.1f ms: %.2f of the floor'"'"'s\n", r, w, a, f, a / f }'
    done <<<"$open_loop"
    floor_rate=
    if [ -n "$attune_rate" ]; then
        log "the floor at maximum rate: floorbench e2e secs=10 warm=3 qtype=quorum inflight=128"
        floor_rate=$(floor secs=10 warm=3 inflight=128 |
            awk '/^RESULT/ { for (i = 1; i <= NF; i++) if ($i == "exec/s") print $(i - 1) }')
        if [ -n "$floor_rate" ]; then
            awk -v a="$attune_rate" -v f="$floor_rate" 'BEGIN {
                printf "core.noop at maximum rate: attune %.1f/s, the naive floor %.1f/s: %.2f of the floor\n", a, f, a / f }'
        else
            log "the floor did not report a rate"
        fi
    fi
    (IFS=,; echo "{\"max_rate\": ${floor_rate:-null}, \"points\": [${points[*]}]}") >"$floor_json"
    if [ -n "$plot" ] && [ ${#points[@]} -gt 1 ]; then
        target/release/attune-bench --replot "$results" --floor "$floor_json" --plot "$plot"
    fi
fi

# The spawn floor (floorbench spawn): the most this machine runs of a process-backed action, no
# database and no broker, measured right after attune in the same sitting (issue 33's yardsticks):
# `core.echo` at maximum rate against it as a ratio, `core.python_echo` against the same floor with
# python3 as the interpreter, and `core.echo`'s p99 at its offered rate (`echo-rate`) against the
# floor's p99 plus 10 ms. ATTUNE_BENCH_NO_FLOOR=1 leaves it out.
row_of() {
    python3 -c 'import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["results"] if r["workload"].startswith(sys.argv[2])]
print(" ".join(str(v) for v in (rows[0]["executions_per_second"], rows[0]["latency_ms"]["p99"], rows[0]["workload"].replace(" ", "_"))) if rows else "")' "$results" "$1" 2>/dev/null || true
}
read -r echo_rate _ _ <<<"$(row_of "core.echo (shell), max rate")"
read -r python_rate _ _ <<<"$(row_of "core.python_echo, max rate")"
read -r _ echo_p99 echo_offered <<<"$(row_of "core.echo at ")"
if [ -z "${ATTUNE_BENCH_NO_FLOOR:-}" ] && [ -n "$echo_rate$python_rate$echo_p99" ] && [ -f "$floor_dir/Cargo.toml" ]; then
    cleanup # attune stops first: the floor gets the machine to itself, as attune had
    trap - EXIT
    if [ ! -x "$floor_dir/target/release/floorbench" ]; then
        log "building the floor ($floor_dir)"
        (cd "$floor_dir" && cargo build --release --quiet)
    fi
    # prints the floor's rate and p99 (ms)
    spawn_floor() {
        log "the spawn floor: floorbench spawn $* concurrency=8 secs=10 warm=2"
        "$floor_dir/target/release/floorbench" spawn "$@" concurrency=8 secs=10 warm=2 2>&1 |
            awk '/^latency spawn/ { for (i = 1; i <= NF; i++) if ($i ~ /^p99=/) { p99 = substr($i, 5); sub(/ms$/, "", p99) } }
                 /^RESULT spawn/ { for (i = 1; i <= NF; i++) if ($i == "spawns/s") rate = $(i - 1) }
                 END { if (rate != "") print rate, p99 }'
    }
    if [ -n "$echo_rate$echo_p99" ]; then
        read -r spawn_rate spawn_p99 <<<"$(spawn_floor script=packs/core/actions/echo.sh)"
        if [ -z "${spawn_rate:-}" ]; then
            log "the spawn floor did not report a rate"
        else
            [ -z "$echo_rate" ] || awk -v a="$echo_rate" -v f="$spawn_rate" 'BEGIN {
                printf "core.echo at maximum rate: attune %.1f/s, the spawn floor %.1f/s: %.2f of the floor\n", a, f, a / f }'
            [ -z "$echo_p99" ] || [ -z "${spawn_p99:-}" ] || awk -v a="$echo_p99" -v f="$spawn_p99" -v w="${echo_offered//_/ }" 'BEGIN {
                printf "p99 of %s: attune %.1f ms, the spawn floor'"'"'s p99 %.1f ms: %+.1f ms over it\n", w, a, f, a - f }'
        fi
    fi
    if [ -n "$python_rate" ]; then
        read -r spawn_rate _ <<<"$(spawn_floor interpreter=python3 script=packs/core/actions/python_echo.py)"
        if [ -z "${spawn_rate:-}" ]; then
            log "the python spawn floor did not report a rate"
        else
            awk -v a="$python_rate" -v f="$spawn_rate" 'BEGIN {
                printf "core.python_echo at maximum rate: attune %.1f/s, the python spawn floor %.1f/s: %.2f of the floor\n", a, f, a / f }'
        fi
    fi
fi
