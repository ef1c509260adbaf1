#!/bin/sh
# A grandchild in the background and a long wait in the foreground: every process of the action
# carries ATTUNE_PARAM_MARKER in its environment, so a test can find them all.
sleep "$ATTUNE_PARAM_SECONDS" &
sleep "$ATTUNE_PARAM_SECONDS"
