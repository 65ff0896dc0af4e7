"""The scorecard page: counts by kind in all and per version, the rate chart, findings search."""

from __future__ import annotations

import pytest
from django.test import Client

from runs import kernel
from tests.conftest import Team
from tests.console import states

pytestmark = pytest.mark.django_db


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def failed_runs(team: Team, name: str, count: int) -> None:
    states.agent(name, team.workspace)
    for _ in range(count):
        run = states.halted_run(team.workspace, team.users["operator"], agent_name=name)
        kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="giving up")


@pytest.mark.spec("F18")
def test_it_shows_failed_runs_by_kind_and_the_findings(team: Team) -> None:
    failed_runs(team, "triage", 2)
    page = client_for(team, "viewer").get(f"/w/{team.slug}/agents/triage/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Failed runs by kind" in html and "tool_failed" in html
    assert '<svg class="chart"' in html and "<polyline" in html
    assert html.count("<tr>") >= 2  # a version row and findings rows
    assert "giving up" not in html  # findings hold no words


def test_it_searches_findings_with_the_job_search_language(team: Team) -> None:
    failed_runs(team, "triage", 1)
    client = client_for(team, "reader")
    hit = client.get(
        f"/w/{team.slug}/agents/triage/", {"q": "agent:triage finding:failure_tool_failed"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "<html" not in hit and "tool_failed" in hit and "No findings match" not in hit
    miss = client.get(
        f"/w/{team.slug}/agents/triage/", {"q": "agent:triage finding:failure_timeout"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "No findings match" in miss
    bad = client.get(f"/w/{team.slug}/agents/triage/", {"q": "colour:blue"}, HTTP_HX_REQUEST="true").content.decode()
    assert "callout-warn" in bad and "colour" in bad


def test_it_hides_the_scorecard_from_outsiders_and_unknown_agents(team: Team) -> None:
    failed_runs(team, "triage", 1)
    assert client_for(team, "outsider").get(f"/w/{team.slug}/agents/triage/").status_code == 404
    assert client_for(team, "viewer").get(f"/w/{team.slug}/agents/nobody-by-this-name/").status_code == 404
    assert Client().get(f"/w/{team.slug}/agents/triage/").status_code == 302
