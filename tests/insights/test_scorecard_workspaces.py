"""Scorecards by agent name, with agents that belong to a workspace."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Team
from tests.insights.planting import make_agent

pytestmark = pytest.mark.django_db


@pytest.mark.spec("F18")
def test_it_does_not_confirm_another_workspaces_agent_exists(team: Any) -> None:
    """Before, any member of any workspace got a (zero) scorecard for every agent name in the install."""
    make_agent("hidden-helper", workspace=team.workspace)
    other = Team()
    status, body = other.api("viewer").get("/insights/agents/hidden-helper")
    assert status == 404 and body["error"]["key"] == "not_found"
    status, body = team.api("viewer").get("/insights/agents/hidden-helper")
    assert status == 200 and body["runs"] == 0


@pytest.mark.parametrize("role,status", [("operator", 200), ("reader", 200), ("viewer", 200), ("outsider", 404)])
def test_it_narrows_a_scorecard_to_one_workspace_of_the_caller(team: Any, role: str, status: int) -> None:
    make_agent("narrowed", workspace=team.workspace)
    got, body = team.api(role).get(f"/insights/agents/narrowed?workspace={team.slug}")
    assert got == status, body
    got, body = team.api(role).get(f"/insights/agents/narrowed?workspace={Team().slug}")
    assert got == 404
