#!/bin/sh
# Exit code 75 (EX_TEMPFAIL) is a transient failure: retried while attempts remain.
if [ "$ATTUNE_RETRY_COUNT" -lt "$ATTUNE_PARAM_FAIL_TIMES" ]; then
    echo "attempt $ATTUNE_RETRY_COUNT: the remote side is busy" >&2
    exit 75
fi
echo "attempt $ATTUNE_RETRY_COUNT: synced"
