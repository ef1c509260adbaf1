#!/bin/sh
# Parameters arrive as data: ATTUNE_PARAM_<NAME> environment variables (and JSON on stdin).
printf '%s\n' "$ATTUNE_PARAM_MESSAGE"
