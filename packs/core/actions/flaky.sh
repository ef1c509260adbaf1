#!/bin/sh
# Exit code 75 (EX_TEMPFAIL) tells attune the failure is transient: it is retried with backoff.
if [ "$ATTUNE_RETRY_COUNT" -lt "$ATTUNE_PARAM_FAIL_TIMES" ]; then
    echo "attempt $ATTUNE_RETRY_COUNT: temporary failure" >&2
    exit 75
fi
echo "attempt $ATTUNE_RETRY_COUNT: done"
