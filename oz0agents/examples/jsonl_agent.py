"""An agent behind oz0's JSON-lines harness, protocol v1 (docs/harness-jsonl.md): it reads the clock
through oz0 (approval, trace), then answers, or ends the job with oz.fail when the issue is 404."""

import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")  # one JSON object per line; logs go to stderr
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    message = json.loads(line) if line else {"type": "cancel"}
    if message["type"] == "cancel":  # the run was canceled: stop at once
        sys.exit(0)
    return message


def call(tool, **args):
    send({"type": "call", "id": f"{tool}-1", "tool": tool, "args": args})
    return receive()  # {"type": "result", "id", "ok", "value" | "failure"}


job = receive()  # {"type": "start", "input", "tools", "failures", "instructions", ...}
issue = (job["input"] or {}).get("issue")
print(f"job {job['run']}: issue {issue}, tools {[t['name'] for t in job['tools']]}", file=sys.stderr)
if issue == 404:
    call("oz.fail", kind="not_found", message=f"issue {issue} does not exist")  # oz0 ends the job here
now = call("clock.now")
answer = f"issue {issue} triaged at unix time {now['value']['unix']:.0f}" if now["ok"] else f"no clock: {now['failure']['kind']}"
send({"type": "done", "output": answer, "usage": {"input_tokens": 0, "output_tokens": 0}})
