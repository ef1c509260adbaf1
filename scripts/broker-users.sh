#!/usr/bin/env bash
# The broker's users, one per service (attune-api, attune-executor, attune-worker), in a vhost of
# attune's own, with the permissions docs/security-broker.md explains. Idempotent: a user that
# exists gets its password set again. Run where `rabbitmqctl` reaches the node (as root on a
# Debian host: the quickstart; inside the broker's container: compose), with
#   ATTUNE_VHOST (default attune), ATTUNE_MQ_API_PASSWORD, ATTUNE_MQ_EXECUTOR_PASSWORD,
#   ATTUNE_MQ_WORKER_PASSWORD; and ATTUNE_MQ_NAMESPACE (default attune: the services' own
#   setting, letters, digits and '_' here) and ATTUNE_MQ_USER_PREFIX (default attune: the users
#   are <prefix>-api, ...).
set -euo pipefail
vhost=${ATTUNE_VHOST:-attune}
ns=${ATTUNE_MQ_NAMESPACE:-attune}
prefix=${ATTUNE_MQ_USER_PREFIX:-attune}
ctl() { rabbitmqctl -q "$@"; }

ctl list_vhosts | grep -qx "$vhost" || ctl add_vhost "$vhost" >/dev/null
# the workers' users: ATTUNE_MQ_WORKERS names them (default `worker`: <prefix>-worker with
# ATTUNE_MQ_WORKER_PASSWORD; `worker-shell worker-python`: one each, with
# ATTUNE_MQ_WORKER_SHELL_PASSWORD, ...), all with the workers' permissions below
workers=${ATTUNE_MQ_WORKERS:-worker}
for service in api executor $workers; do
    variable="ATTUNE_MQ_$(echo "$service" | tr a-z- A-Z_)_PASSWORD"
    password=${!variable:?set $variable}
    if ctl list_users | awk '{print $1}' | grep -qx "$prefix-$service"; then
        ctl change_password "$prefix-$service" "$password" >/dev/null
    else
        ctl add_user "$prefix-$service" "$password" >/dev/null
    fi
done

# configure, write, read. Every service declares the shared topology (so each may configure and
# bind every shared name); the API writes only cancel notices and follow requests (<ns>.control),
# an executor its fence notices there too (signed: docs/adr/0011),
# never to <ns>, and declares, binds and reads its live output queues (<ns>.output.<hex>); a
# worker writes live output to <ns>.output, which it cannot read.
shared='dlx|control|output|dlq|parked|execution\.requests|execution\.results'
own='worker\.[0-9]+\.ttl[0-9]+\.q2|control\.[0-9]+\.[0-9a-f]+'
follower='output\.[0-9a-f]{32}'
ctl set_permissions -p "$vhost" "$prefix-api" "^$ns(\.($shared|$follower))?\$" \
    "^$ns\.(control|dlx|dlq|parked|execution\.requests|execution\.results|$follower)\$" \
    "^$ns(\.(dlx|output|execution\.requests|execution\.results|$follower))?\$" >/dev/null
ctl set_permissions -p "$vhost" "$prefix-executor" "^$ns(\.($shared))?\$" \
    "^$ns(\.(dlx|control|dlq|parked|execution\.requests|execution\.results))?\$" \
    "^$ns(\.(dlx|dlq|execution\.requests|execution\.results))?\$" >/dev/null
for worker in $workers; do
    ctl set_permissions -p "$vhost" "$prefix-$worker" "^$ns(\.($shared|$own))?\$" \
        "^$ns(\.(dlx|dlq|parked|output|execution\.requests|execution\.results|$own))?\$" \
        "^$ns(\.(dlx|control|execution\.requests|execution\.results|$own))?\$" >/dev/null
done
