"""A JSON-lines harness (protocol v1) the tests script through the environment: OZ0_TEST_SCRIPT is a
JSON list of steps, OZ0_TEST_RECORD a file where every message received is appended with its time.
With OZ0_TEST_SESSIONS (a file counting the sessions started), a step holding `session: n` is taken
only in the n-th session of the round (a retry's process runs the same script)."""

import json
import os
import sys
import time

RECORD = os.environ.get("OZ0_TEST_RECORD")


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    message = json.loads(line) if line else {"type": "eof"}
    if RECORD:
        with open(RECORD, "a") as record:
            record.write(json.dumps({**message, "at": time.time()}) + "\n")
    return message


start = receive()
SESSIONS = os.environ.get("OZ0_TEST_SESSIONS")
session = 1
if SESSIONS:
    if os.path.exists(SESSIONS):
        with open(SESSIONS) as counter:
            session = int(counter.read()) + 1
    with open(SESSIONS, "w") as counter:
        counter.write(str(session))
print(f"started on {start['task']} with {[t['name'] for t in start['tools']]}", file=sys.stderr)
last = None
for step in json.loads(os.environ.get("OZ0_TEST_SCRIPT", "[]")):
    if step.get("session", session) != session:
        continue
    if "call" in step:
        send({"type": "call", "id": step.get("id", "c"), "tool": step["call"], "args": step.get("args", {})})
        last = receive()
    elif "ask" in step:
        send({"type": "call", "id": "q", "tool": "oz.ask", "args": {"question": step["ask"]}})
        last = receive()
    elif "fail" in step:
        send({"type": "call", "id": "f", "tool": "oz.fail", "args": step["fail"]})
        last = receive()
    elif "done" in step:
        output = last if step["done"] == "$last" else step["done"]
        send({"type": "done", "output": output, "usage": step.get("usage")})
    elif "crash" in step:
        print(step.get("stderr", "crashing"), file=sys.stderr, flush=True)
        sys.exit(step["crash"])
    elif "raw" in step:
        sys.stdout.write(step["raw"] + "\n")
        sys.stdout.flush()
    elif "send" in step:  # a call whose answer it does not wait for
        send({"type": "call", "id": "s", "tool": step["send"], "args": step.get("args", {})})
    elif "sleep" in step:
        time.sleep(step["sleep"])
    elif "flood" in step:  # lines of output oz0 did not ask for, `flood` bytes of them
        line = json.dumps({"type": "usage", "usage": {}, "pad": "x" * 4000}) + "\n"
        for _ in range(step["flood"] // len(line) + 1):
            sys.stdout.write(line)
        sys.stdout.flush()
    elif "wait" in step:
        last = receive()  # a cancel, or the end of input
        if step.get("ignore_cancel"):
            time.sleep(60)
time.sleep(float(os.environ.get("OZ0_TEST_LINGER", "0")))
