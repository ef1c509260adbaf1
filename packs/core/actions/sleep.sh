#!/bin/sh
sleep "$ATTUNE_PARAM_SECONDS"
echo "slept $ATTUNE_PARAM_SECONDS s"
