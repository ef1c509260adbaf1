#!/usr/bin/env bash
# Tries the README's two commands as a new user would, on a fresh Debian 12: a minimal bookworm
# root filesystem (debootstrap --variant=minbase) with Rust copied in and nothing else, then, in a
# chroot, `scripts/quickstart.sh` and `scripts/test.sh` on a copy of this repository's HEAD. Prints
# how each went and exits non-zero if either failed.
#
# The chroot shares this machine's network, so its PostgreSQL and RabbitMQ need the ports this
# machine's own may hold: those are stopped for the trial and started again when it ends, however
# it ends. Needs root, network access (Debian's mirror, crates.io, PyPI) and about 6 GB in
# $ATTUNE_TRIAL_DIR (default /var/tmp/attune-trial), which is removed at the start of each trial;
# after a trial that passed only its logs stay there (ATTUNE_TRIAL_KEEP=1 keeps the root too).
#
#   sudo scripts/fresh-debian-trial.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
. scripts/lib.sh

[ "$(id -u)" = 0 ] || die "the trial needs root (debootstrap, chroot, mounts)"
TRIAL=${ATTUNE_TRIAL_DIR:-/var/tmp/attune-trial}
ROOT=$TRIAL/rootfs
MIRROR=${ATTUNE_TRIAL_MIRROR:-http://deb.debian.org/debian}
TOOLCHAIN=$(rustc --print sysroot)

command -v debootstrap >/dev/null || apt_install debootstrap

# --- this machine's services: stopped for the trial, started again at the end, whatever happens
host_pg=""; host_rabbit=""
port_open 127.0.0.1 5432 && host_pg=1
port_open 127.0.0.1 5672 && host_rabbit=1

chroot_processes() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$ROOT" ] && echo "${p#/proc/}"
    done
    return 0
}

restore() {
    local status=$?
    set +e
    log "ending the trial: stopping what runs in the chroot, unmounting, restarting this machine's services"
    for _ in 1 2 3; do
        pids=$(chroot_processes)
        [ -z "$pids" ] && break
        kill $pids 2>/dev/null; sleep 2
        pids=$(chroot_processes); [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    done
    for m in dev/shm dev/pts dev sys proc; do
        mountpoint -q "$ROOT/$m" && umount -l "$ROOT/$m"
    done
    # a trial that passed leaves its logs, not its 6 GB root (kept after a failure, to look into;
    # never removed while anything is still mounted under it)
    if [ "$status" = 0 ] && [ -z "${ATTUNE_TRIAL_KEEP:-}" ] && ! grep -q " $ROOT" /proc/mounts; then
        rm -rf --one-file-system "$ROOT"
    fi
    if [ -n "$host_pg" ] && ! port_open 127.0.0.1 5432; then
        version=$(ls /etc/postgresql | sort -V | tail -n1)
        pg_ctlcluster --skip-systemctl-redirect "$version" main start || service postgresql start
        wait_port 127.0.0.1 5432 PostgreSQL 60
    fi
    if [ -n "$host_rabbit" ] && ! port_open 127.0.0.1 5672; then
        rabbitmq-server -detached || service rabbitmq-server start
        wait_port 127.0.0.1 5672 RabbitMQ 120
    fi
    exit $status
}
trap restore EXIT

# --- a fresh minimal Debian 12, with Rust and the repository copied in
log "building a minimal Debian 12 root in $ROOT"
rm -rf "$TRIAL"
mkdir -p "$TRIAL"
debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$TRIAL/debootstrap.log" 2>&1 \
    || { tail -n 20 "$TRIAL/debootstrap.log" >&2; die "debootstrap failed"; }
log "copying Rust ($TOOLCHAIN) and the repository (HEAD) in"
mkdir -p "$ROOT/opt/rust" "$ROOT/root/attune"
cp -a "$TOOLCHAIN/." "$ROOT/opt/rust/"
git -C "$REPO" archive HEAD | tar -x -C "$ROOT/root/attune"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# the network's own certificate authorities (a TLS-inspecting proxy's, say): a new user on this
# network has them too; Debian's ca-certificates adds them to the system store when it installs
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$ROOT/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
fi
mount -t proc proc "$ROOT/proc"
mount -t sysfs sys "$ROOT/sys"
mount --bind /dev "$ROOT/dev"
mount --bind /dev/pts "$ROOT/dev/pts"
mount -t tmpfs shm "$ROOT/dev/shm"

# --- this machine's services give up their ports
if [ -n "$host_pg" ]; then
    log "stopping this machine's PostgreSQL for the trial"
    version=$(ls /etc/postgresql | sort -V | tail -n1)
    pg_ctlcluster --skip-systemctl-redirect "$version" main stop || service postgresql stop
fi
if [ -n "$host_rabbit" ]; then
    log "stopping this machine's RabbitMQ for the trial"
    rabbitmqctl stop >/dev/null 2>&1 || service rabbitmq-server stop
    for _ in $(seq 1 100); do port_open 127.0.0.1 5672 || break; sleep 0.2; done
fi

# --- the README's two commands, as a new user runs them
# this network's settings for TLS clients (where to find the certificate store), as set here
network_env=()
for name in SSL_CERT_FILE SSL_CERT_DIR PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE http_proxy https_proxy no_proxy; do
    [ -n "${!name:-}" ] && network_env+=("$name=${!name}")
done
in_chroot() {
    chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 "${network_env[@]}" \
        PATH=/opt/rust/bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        bash -c "cd /root/attune && $1"
}
results=()
failed=0
for command in scripts/quickstart.sh scripts/test.sh; do
    log "in the chroot: $command"
    started=$(date +%s)
    set +e
    in_chroot "$command" >"$TRIAL/$(basename "$command").log" 2>&1
    status=$?
    set -e
    took=$(( $(date +%s) - started ))
    closing=$(grep -aE '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$TRIAL/$(basename "$command").log" | tail -n1 || true)
    results+=("$command: exit $status in $((took / 60)) min $((took % 60)) s${closing:+ ($closing)}")
    if [ "$status" != 0 ]; then
        failed=1
        tail -n 40 "$TRIAL/$(basename "$command").log" >&2
        break
    fi
done
in_chroot "make down" >/dev/null 2>&1 || true

printf '\nfresh Debian 12 trial (%s):\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
printf '  %s\n' "${results[@]}"
printf '  logs: %s\n' "$TRIAL"
exit $failed
