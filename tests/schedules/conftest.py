"""A workspace agent the schedules start (the script provider: no model, no worker needed)."""

from __future__ import annotations

from typing import Any

import pytest

from oz0agents.registry import register
from tests.conftest import Team

MANIFEST = """\
name: {name}
model: script
script:
  - text: done
"""


def agent_of(team: Team, name: str = "nightly-report") -> str:
    register(MANIFEST.format(name=name), team.users["operator"], workspace=team.workspace)
    return name


@pytest.fixture
def agent(team: Team, no_dispatch: Any) -> str:
    return agent_of(team)


def schedule_body(agent: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "nightly",
        "run": {"agent": agent, "input": {"day": "today"}},
        "cron": "0 3 * * *",
        "timezone": "Europe/Paris",
        **extra,
    }
