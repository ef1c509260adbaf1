#!/bin/sh
echo $$ > "$ATTUNE_PARAM_PIDFILE"
exec sleep 60
