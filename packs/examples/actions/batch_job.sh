#!/bin/sh
# Attempt 0, 1, 2 ... of the chain; the idempotency key is the same for every attempt.
echo "attempt $ATTUNE_RETRY_COUNT of chain $ATTUNE_IDEMPOTENCY_KEY"
sleep "$ATTUNE_PARAM_SECONDS"
exit "$ATTUNE_PARAM_EXIT_CODE"
