"""A scripted agent whose second version fixes one of two failures its first version had.

v1 lists `oz.fail` only: a model that calls `test.echo` is refused (the round fails, kind
`model`, and the run holds). v2 lists `test.echo` too, so the same answers complete. A model
that calls `oz.fail` with `not_found` fails the same way on both. Neither version brings a
script of its own, so an eval replays each case's recorded answers.
"""

from __future__ import annotations

from typing import Any

from oz0agents.registry import register
from runs import kernel
from runs.models import Run
from tests.conftest import Team
from tests.factories import unique
from tests.runs.driver import drive

FIXED_BY_V2 = [{"tool_calls": [{"tool": "test.echo", "args": {"value": "SECRET-ECHO"}}]}, {"text": "done"}]
FAILS_ALWAYS = [{"oz_fail": {"kind": "not_found", "message": "issue 'SECRET-9' is gone"}}]
MANIFEST = (
    "name: {name}\nmodel: script\ninstructions: Triage the issue.\ntools: [{tools}]\napproval: {{mode: bypass}}\n"
    "failures:\n  - kind: not_found\n    description: The issue does not exist\n"
)


def register_version(team: Team, name: str, tools: str) -> int:
    return register(MANIFEST.format(name=name, tools=tools), team.users["operator"], workspace=team.workspace).version.version


def scripted_agent(team: Team, *, fixed: bool = False) -> str:
    """The agent at v1 (or at v2 too, with `fixed`)."""
    name = unique("triage")
    register_version(team, name, "oz.fail")
    if fixed:
        register_version(team, name, "oz.fail, test.echo")
    return name


def failed_run(team: Team, agent: str, script: list[Any], *, user: str = "operator", private: bool = False, **extra: Any) -> Run:
    """A run of the agent's serving version whose model answered `script`, driven to its failure."""
    body = {
        "agent": agent,
        "input": {"issue": "SECRET-INPUT"},
        "private": private,
        "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "Triage.", "script": script}],
        **extra,
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users[user], body=body)
    return drive(run)


def drive_eval_runs(evaluation: Any) -> None:
    for result in evaluation.results.exclude(run=None).select_related("run"):
        drive(result.run)
