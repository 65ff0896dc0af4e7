"""The inbox's smaller touches (issue 30, item 6): a hold card shows its failure's key (and its
message to those who may read it), the tab counts follow the agent filter, and the page title
carries how many items wait."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from tests.conftest import Team
from tests.console import states

pytestmark = pytest.mark.django_db


def page(team: Team, role: str, query: str = "") -> str:
    client = Client()
    client.force_login(team.users[role])
    response = client.get(f"/w/{team.slug}/inbox/{query}")
    assert response.status_code == 200
    return response.content.decode()


def count(html: str, kind: str) -> str:
    match = re.search(rf'data-count="{kind}">([^<]*)<', html)
    assert match, html[:1000]
    return match.group(1)


@pytest.mark.spec("F11", "F12")
def test_a_hold_card_shows_the_failures_key_and_its_message_to_readers_only(team: Team) -> None:
    states.halted_run(team.workspace, team.users["operator"], detail="disk full on /var")
    for role in ("operator", "reader"):
        html = page(team, role)
        assert '<code class="key error-key">tool_failed</code>' in html and "disk full on /var" in html
    viewer = page(team, "viewer")
    assert '<code class="key error-key">tool_failed</code>' in viewer
    assert "disk full" not in viewer and "its message is hidden from your role" in viewer
    status, body = team.api("viewer").get(f"/inbox?workspace={team.slug}&kind=hold")
    assert status == 200 and body["items"][0]["error"] == {"key": "tool_failed", "detail": None}
    status, body = team.api("reader").get(f"/inbox?workspace={team.slug}&kind=hold")
    assert body["items"][0]["error"] == {"key": "tool_failed", "detail": "disk full on /var"}
    assert body["items"][0]["failure_kind"] == "tool_failed"


def test_the_tab_counts_follow_the_agent_filter(team: Team) -> None:
    alpha = states.agent("alpha", team.workspace)
    beta = states.agent("beta", team.workspace)
    states.approval_run(team.workspace, team.users["operator"], agent_name=alpha)
    states.approval_run(team.workspace, team.users["operator"], agent_name=beta)
    states.halted_run(team.workspace, team.users["operator"], agent_name=beta)
    every: Any = page(team, "viewer")
    assert (count(every, "all"), count(every, "approval"), count(every, "hold")) == ("3", "2", "1")
    only_alpha = page(team, "viewer", "?agent=alpha")
    assert (count(only_alpha, "all"), count(only_alpha, "approval"), count(only_alpha, "hold")) == ("1", "1", "0")


def test_the_page_title_carries_the_pending_count(team: Team) -> None:
    assert "<title>Inbox · " in page(team, "viewer")
    states.approval_run(team.workspace, team.users["operator"])
    assert f"<title>(1) Inbox · {team.slug} · oz0</title>" in page(team, "viewer")
