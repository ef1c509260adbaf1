#!/bin/sh
printf '%s\n' "$ATTUNE_PARAM_MESSAGE" >&2
exit "$ATTUNE_PARAM_EXIT_CODE"
