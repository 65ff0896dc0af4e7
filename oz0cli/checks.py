"""`./oz0 test [PYTEST ARGS]`: ruff, ruff format --check, makemigrations --check and mypy
(unless OZ0_SKIP_CHECKS), then pytest with the arguments given; one exit code for them all."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from oz0cli import ROOT, say
from oz0cli.environment import use_base_environment
from oz0cli.services import services


def checks_wanted(environ: Mapping[str, str]) -> bool:
    return environ.get("OZ0_SKIP_CHECKS", "") not in ("1", "true", "yes")


def check_commands(python: str) -> list[tuple[str, list[str]]]:
    """The static checks; which files ruff and mypy cover (the `./oz0` launcher too) is pyproject.toml's."""
    return [
        ("ruff check", [python, "-m", "ruff", "check"]),
        ("ruff format --check", [python, "-m", "ruff", "format", "--check"]),
        ("makemigrations --check", [python, "manage.py", "makemigrations", "--check", "--dry-run"]),
        ("mypy", [python, "-m", "mypy"]),
    ]


def combined_exit_code(failed: list[str], pytest_code: int) -> int:
    """pytest's own code, except that a failed check fails the whole (pytest's 0 or 5 become 1)."""
    if failed:
        return 1 if pytest_code in (0, 5) else pytest_code
    return pytest_code


def cmd_test(args: list[str]) -> int:
    os.environ.setdefault("OZ0_TEST_TOOLS", "1")
    use_base_environment(debug=True)
    python = sys.executable
    with services():
        failed: list[str] = []
        if checks_wanted(os.environ):
            for name, argv in check_commands(python):
                say(f"{name}")
                if subprocess.run(argv, cwd=ROOT).returncode != 0:
                    failed.append(name)
        say("pytest " + " ".join(args))
        code = subprocess.run([python, "-m", "pytest", *args], cwd=ROOT).returncode
        if failed:
            say("failed: " + ", ".join(failed) + (f"; pytest exited {code}" if code else ""))
        return combined_exit_code(failed, code)
