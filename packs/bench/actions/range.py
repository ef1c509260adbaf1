"""Prints {"items": [0, 1, ..., count - 1]} as its result (the last line of stdout)."""
import json
import sys

params = json.load(sys.stdin)
print(json.dumps({"items": list(range(params["count"]))}))
