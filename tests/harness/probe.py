"""A JSON-lines harness (protocol v1) that reports what its process can see and reach: its user,
folder, environment, descriptors and limits, and, for each path in OZ0_TEST_PROBE (comma-separated),
whether it could read it or which error the system gave. It answers the facts as its `done`."""

import errno
import json
import os
import resource
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


start = json.loads(sys.stdin.readline())
reads = {}
for path in filter(None, os.environ.get("OZ0_TEST_PROBE", "").split(",")):
    try:
        with open(path, "rb") as target:
            reads[path] = {"read": target.read(4096).decode("utf-8", "replace")}
    except OSError as error:
        reads[path] = {"error": errno.errorcode.get(error.errno, str(error.errno))}
limits = {
    name: resource.getrlimit(getattr(resource, name))[0] for name in ("RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_NPROC", "RLIMIT_CORE")
}
facts = {
    "uid": os.getuid(),
    "euid": os.geteuid(),
    "groups": os.getgroups(),
    "cwd": os.getcwd(),
    "env": dict(os.environ),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "limits": limits,
    "reads": reads,
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}
send({"type": "done", "output": facts})
