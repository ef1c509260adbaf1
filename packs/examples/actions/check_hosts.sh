#!/bin/sh
# Parameters arrive as data: ATTUNE_PARAM_<NAME> environment variables (arrays as JSON).
printf '{"checked": %s, "unhealthy": %s}\n' "$ATTUNE_PARAM_HOSTS" "$ATTUNE_PARAM_UNHEALTHY"
