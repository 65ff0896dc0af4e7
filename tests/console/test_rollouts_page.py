"""The Agents page's Rollouts section (issue 33 item 4): a canary and its stable version side by
side for every role, the Promote and Roll back buttons for operators only, each POST's role
matrix, htmx fragments and typed refusals; nothing changes on a refusal."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from oz0agents.models import Agent, RolloutEvent
from tests.agents.test_rollouts import rolling, runs_of
from tests.conftest import Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]
HX: dict[str, Any] = {"HTTP_HX_REQUEST": "true"}


def _client(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


@pytest.mark.parametrize("role", ["viewer", "reader", "operator"])
def test_every_member_sees_both_arms_and_only_an_operator_the_buttons(team: Team, role: str) -> None:
    agent = rolling(team, percent=10)
    runs_of(agent, "canary", completed=1, failed=1, kind="not_found")
    runs_of(agent, "stable", completed=4)
    response = _client(team, role).get(f"/w/{team.slug}/agents/")
    html = response.content.decode()
    assert response.status_code == 200
    assert f'data-agent="{agent.name}"' in html and "canary v2 on 10 % of new runs beside stable v1" in html
    assert 'class="arm arm-canary"' in html and 'class="arm arm-stable"' in html
    assert "not_found <b>1</b>" in html and "50%" in html  # the canary's kind and failure rate
    assert ('data-verb="promote"' in html) is (role == "operator")
    assert ('data-verb="rollback"' in html) is (role == "operator")


@pytest.mark.parametrize("verb", ["promote", "rollback"])
def test_only_an_operator_may_promote_or_roll_back_and_gets_the_section_back(team: Team, verb: str) -> None:
    agent = rolling(team)
    path = f"/w/{team.slug}/agents/{agent.name}/rollout/{verb}/"
    assert _client(team, "outsider").post(path, **HX).status_code == 404
    for role in ("viewer", "reader"):
        assert _client(team, role).post(path, **HX).status_code == 403
        assert _client(team, role).post(path).status_code == 403
    assert Client().post(path).status_code == 302  # anonymous: to sign in
    assert _client(team, "operator").get(path).status_code == 405
    assert Agent.objects.get(pk=agent.pk).canary_version_id is not None
    assert not RolloutEvent.objects.filter(agent=agent).exclude(verb="canary_started").exists()

    response = _client(team, "operator").post(path, **HX)
    html = response.content.decode()
    assert response.status_code == 200 and 'id="rollouts"' in html
    assert "No canary under way" in html
    assert ("promoted" if verb == "promote" else "rolled back") in html  # the trail's newest row
    assert Agent.objects.get(pk=agent.pk).canary_version_id is None
    # Again: nothing to act on, a typed refusal in a toast.
    again = _client(team, "operator").post(path, **HX)
    assert again.status_code == 409 and "no canary" in again.content.decode()


def test_a_plain_post_redirects_to_the_agents_page_and_an_unknown_agent_is_404(team: Team) -> None:
    agent = rolling(team)
    operator = _client(team, "operator")
    response = operator.post(f"/w/{team.slug}/agents/{agent.name}/rollout/rollback/")
    assert response.status_code == 302 and response["Location"] == f"/w/{team.slug}/agents/"
    assert operator.post(f"/w/{team.slug}/agents/{'x' * 5000}/rollout/promote/", **HX).status_code == 404
