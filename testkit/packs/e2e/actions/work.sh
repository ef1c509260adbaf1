#!/bin/sh
sleep "$ATTUNE_PARAM_SECONDS"
echo "worked on attempt $ATTUNE_RETRY_COUNT"
