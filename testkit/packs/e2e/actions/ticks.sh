#!/bin/sh
# Prints "tick <n>" on stdout once a second for `seconds` seconds, and "halfway" on stderr
# halfway through: output that comes while the run goes on, for live output tests.
n=1
while [ "$n" -le "$ATTUNE_PARAM_SECONDS" ]; do
    echo "tick $n"
    if [ "$n" -eq $(( (ATTUNE_PARAM_SECONDS + 1) / 2 )) ]; then echo "halfway" >&2; fi
    [ "$n" -lt "$ATTUNE_PARAM_SECONDS" ] && sleep 1
    n=$((n + 1))
done
