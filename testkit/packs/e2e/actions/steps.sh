#!/bin/sh
# Appends "start <id>" to the file `log`, sleeps `seconds`, then appends "end <id>": a run that
# was stopped has a start line and no end line.
echo "start $ATTUNE_EXECUTION_ID" >> "$ATTUNE_PARAM_LOG"
sleep "$ATTUNE_PARAM_SECONDS"
echo "end $ATTUNE_EXECUTION_ID" >> "$ATTUNE_PARAM_LOG"
