#!/bin/sh
sleep 1
printf '{"host": "%s", "service": "%s", "restarted": true}\n' "$ATTUNE_PARAM_HOST" "$ATTUNE_PARAM_SERVICE"
