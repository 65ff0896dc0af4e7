"""Every command but `up` and `test`: one child process (python -m bench, manage.py ...) with the
services around it; the child gets Ctrl-C itself and finishes, SIGTERM stops it first."""

from __future__ import annotations

import subprocess

from oz0cli import ROOT
from oz0cli.services import services

MANAGE_VERBS = {
    ("token", "create"): "token_create",
    ("token", "list"): "token_list",
    ("token", "revoke"): "token_revoke",
    ("plugin", "lint"): "plugin_lint",
    ("job", "search"): "job_search",
    ("insights", "agent"): "insights_agent",
    ("eval", "run"): "eval_run",
}


def child_argv(python: str, command: str, rest: list[str]) -> list[str] | None:
    """The child a command runs (`bench` is `python -m bench`), or None for an unknown command."""
    if command == "bench":
        return [python, "-m", "bench", *rest]
    if command == "manage":
        return [python, "manage.py", *rest]
    if command == "runner":
        return [python, "manage.py", "runner", *rest]
    if rest and (command, rest[0]) in MANAGE_VERBS:
        return [python, "manage.py", MANAGE_VERBS[(command, rest[0])], *rest[1:]]
    return None


def run_child(argv: list[str]) -> int:
    with services():
        process = subprocess.Popen(argv, cwd=ROOT)
        try:
            while True:
                try:
                    return process.wait()
                except KeyboardInterrupt:  # the child got the Ctrl-C too; let it finish
                    continue
        finally:
            if process.poll() is None:  # we were told to stop (SIGTERM): the child goes first
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
