#!/bin/sh
if [ "$ATTUNE_RETRY_COUNT" -lt "$ATTUNE_PARAM_FAIL_TIMES" ]; then
    echo "attempt $ATTUNE_RETRY_COUNT failing with $ATTUNE_PARAM_EXIT_CODE" >&2
    exit "$ATTUNE_PARAM_EXIT_CODE"
fi
echo "succeeded on attempt $ATTUNE_RETRY_COUNT"
