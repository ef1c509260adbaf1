"""Reads the parameters from stdin and prints a JSON result on the last line of stdout."""
import json
import sys

params = json.load(sys.stdin)
print(json.dumps({"echo": " ".join([params["message"]] * params["repeat"])}))
