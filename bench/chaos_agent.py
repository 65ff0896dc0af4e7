"""A harnessed agent for the chaos workload (JSON-lines protocol v1, docs/harness-jsonl.md): its
session waits on one `test.sleep` call made through oz0, then answers. Killing the session worker
while it waits is the "session worker killed mid-session" fault."""

import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    message = json.loads(line) if line else {"type": "cancel"}
    if message["type"] == "cancel":
        sys.exit(0)
    return message


job = receive()
seconds = (job.get("input") or {}).get("seconds", 1)
send({"type": "call", "id": "stay", "tool": "test.sleep", "args": {"seconds": seconds}})
result = receive()
send({"type": "done", "output": {"slept": result.get("value")}, "usage": {"input_tokens": 0, "output_tokens": 0}})
