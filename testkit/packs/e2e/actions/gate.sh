#!/bin/sh
# Waits until the file `gate` exists (a test opens it), then exits: runs that pile up behind a
# closed gate hold a worker's slots for exactly as long as the test wants.
while [ ! -e "$ATTUNE_PARAM_GATE" ]; do sleep 0.05; done
