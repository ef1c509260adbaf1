#!/usr/bin/env bash
# Command 2: the whole test suite (format, lints, unit, repository, API and end-to-end tests) on
# the real PostgreSQL and RabbitMQ, which it sets up first if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_rust
ensure_tools
ensure_services
ensure_test_logins
ensure_chromium
ensure_schemathesis
ensure_sqlx_cli
ensure_prometheus
ensure_mdbook
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
log "the book (mdbook build book; its links are checked by tests/tests/tidy/book.rs)"
"$MDBOOK" build book 2>&1 | grep -v INFO || true
test -f target/book/index.html || die "mdbook did not build the book"
log "building the binaries the end-to-end tests start"
cargo build --workspace --bins --quiet
log "cargo test"
mkdir -p target
status=0
cargo test --workspace --all-targets --no-fail-fast "$@" 2>&1 | tee target/test-output.log || status=$?
# --all-targets leaves out doctests (the quick reference's configuration literals are doctests)
cargo test --workspace --doc --no-fail-fast 2>&1 | tee -a target/test-output.log || status=$?
# The broker-restart test disturbs every user of RabbitMQ: it runs alone, after the others.
if [ "$status" = 0 ] && [ -z "${ATTUNE_SKIP_BROKER_CHAOS:-}" ]; then
    log "broker chaos test (alone)"
    echo "attune: second pass" >> target/test-output.log
    cargo test -p attune-system-tests --test chaos_broker -- --ignored --test-threads=1 2>&1 | tee -a target/test-output.log || status=$?
fi
# The RabbitMQ cluster test (issue 36) starts three more broker nodes: after the others, where
# this machine can run them (root, Debian's rabbitmq-server), and they are stopped after it.
if [ "$status" = 0 ] && [ -z "${ATTUNE_SKIP_CLUSTER:-}" ] && [ "$(id -u)" = 0 ] && [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
    log "RabbitMQ cluster test (scripts/test-cluster.sh)"
    echo "attune: second pass" >> target/test-output.log
    if scripts/test-cluster.sh start; then
        cargo test -p attune-system-tests --test broker_cluster -- --ignored --test-threads=1 2>&1 | tee -a target/test-output.log || status=$?
    else
        status=1
    fi
    scripts/test-cluster.sh stop || true
fi
# The host tests (issue 36) put workers in network namespaces of this machine and cut them off:
# they need root and iproute2.
if [ "$status" = 0 ] && [ -z "${ATTUNE_SKIP_CLUSTER:-}" ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    log "host tests (workers in network namespaces, cut off and healed)"
    echo "attune: second pass" >> target/test-output.log
    cargo test -p attune-system-tests --test hosts -- --ignored --test-threads=1 2>&1 | tee -a target/test-output.log || status=$?
fi
# The PostgreSQL switchover test (issue 36) starts a primary and its synchronous standby (ports
# 5695 and 5696) beside the machine's own server: likewise last, where this machine can run them
# (root, Debian's PostgreSQL 15), and they are stopped (their data removed) after it.
if [ "$status" = 0 ] && [ -z "${ATTUNE_SKIP_CLUSTER:-}" ] && [ "$(id -u)" = 0 ] && [ -x /usr/lib/postgresql/15/bin/postgres ]; then
    log "PostgreSQL switchover test (scripts/test-pg-standby.sh)"
    echo "attune: second pass" >> target/test-output.log
    if scripts/test-pg-standby.sh start; then
        cargo test -p attune-system-tests --test pg_switchover -- --ignored --test-threads=1 2>&1 | tee -a target/test-output.log || status=$?
    else
        status=1
    fi
    scripts/test-pg-standby.sh stop || true
fi
# One closing line for the whole run, summed over every test binary: what ran in the second pass
# was counted as ignored in the first, and is counted once, as what it did.
awk '/^attune: second pass$/ { second = 1 }
     /^test result:/ { for (i = 1; i <= NF; i++) {
         if ($i ~ /^passed;?$/) { p += $(i-1); if (second) ran += $(i-1) }
         if ($i ~ /^failed;?$/) { f += $(i-1); if (second) ran += $(i-1) }
         if ($i ~ /^ignored;?$/ && !second) s += $(i-1) } }
     END { printf "\n%d passed, %d failed, %d skipped\n", p, f, s - ran }' target/test-output.log
exit "$status"
