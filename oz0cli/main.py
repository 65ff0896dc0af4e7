"""`./oz0 COMMAND [ARGS...]` inside `.venv`: the usage, and which module runs which command."""

from __future__ import annotations

import os
import sys

from oz0cli import ROOT, say
from oz0cli.checks import cmd_test
from oz0cli.children import child_argv, run_child
from oz0cli.environment import use_base_environment
from oz0cli.processes import cmd_serve
from oz0cli.up import cmd_up

USAGE = """usage: ./oz0 COMMAND [ARGS...]

  up [--demo]            start oz0 (embedded PostgreSQL and Redis unless DATABASE_URL / REDIS_URL are set),
                         load the demo, serve the console; Ctrl-C stops everything. --demo also installs
                         the deterministic test.* tools (for trying the API; never on a real install)
  serve ROLE             run one process of a deployment in the foreground: web | worker | sessions | beat
                         (the command `up` runs for it; needs DATABASE_URL, REDIS_URL and SECRET_KEY; deploy/)
  test [--quick] [PYTEST ARGS]
                         ruff, ruff format --check, makemigrations --check, mypy, then pytest (slow,
                         live and the rest side by side); --quick: no live, browser or slow tests
  token create USER --workspace WS --role ROLE [--expires-in DAYS]
                         print a bearer token for USER (creates the user and workspace when missing)
  token list USER        USER's API tokens: id, hint, label, dates, status
  token revoke ID...     revoke API tokens by id
  bench ...              python -m bench ...
  plugin lint ...        manage.py plugin_lint ...
  job search ...         manage.py job_search ...
  insights agent ...     manage.py insights_agent ...
  eval run AGENT --version N [--workspace WS] [--wait]
                         run AGENT's regression cases against version N: per case the kind before and
                         after and whether it passed (manage.py eval_run; exit 1 when a case failed again)
  runner ...             manage.py runner ...
  manage ...             manage.py ...
"""


def dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "up":
        return cmd_up(rest)
    if command == "test":
        return cmd_test(rest)
    if command == "serve":
        return cmd_serve(rest)
    use_base_environment(debug=False)
    child = child_argv(sys.executable, command, rest)
    if child is not None:
        return run_child(child)
    say(f"unknown command {' '.join(argv[:2])!r}")
    print(USAGE, file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    """Called by the `./oz0` launcher inside `.venv`; it maps a Fatal to 2 and Ctrl-C to 130."""
    os.chdir(ROOT)
    return dispatch(argv)
