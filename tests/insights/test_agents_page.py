"""The Agents page: every agent of a workspace with its last 30 days per version, read from
the rollups; the same numbers as the scorecard API; sortable from a whitelist; no words."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from insights import overview
from oz0agents.models import AgentVersion
from runs.models import Run
from tests.conftest import Team
from tests.insights.conftest import answering_round, nothing_sent, oz_fail_round, run_agent, team_of
from tests.insights.planting import make_agent

pytestmark = pytest.mark.django_db

SECRET = "SECRETWORDSOFAFAILURE"


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def add_version(agent: str, version: int) -> None:
    latest = AgentVersion.objects.filter(agent__name=agent).order_by("-version").first()
    assert latest is not None
    AgentVersion.objects.create(
        agent=latest.agent, version=version, manifest_text=latest.manifest_text, manifest=latest.manifest, digest=f"v{version}"
    )


def held_round() -> dict[str, Any]:
    return {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": [{"http": 401}], "on_failure": "halt"}


team = team_of("fleet")


@pytest.fixture(scope="module")
def fleet(shared_team: Team, module_transaction: Any) -> Team:
    """flaky: v1 failed 2 of 3 (not_found), v2 failed 2 of 4 (tracker_busy, and a hold: a finding too);
    steady: one version, 2 runs, none failed; idle: registered, never run."""
    team = shared_team
    with module_transaction.unblock(), nothing_sent():
        make_agent("flaky", workspace=team.workspace, kinds=("not_found", "tracker_busy"))
        run_agent(team, "flaky", oz_fail_round("not_found", SECRET))
        run_agent(team, "flaky", oz_fail_round("not_found", SECRET))
        run_agent(team, "flaky", answering_round())
        add_version("flaky", 2)
        run_agent(team, "flaky", oz_fail_round("tracker_busy", SECRET))
        run_agent(team, "flaky", answering_round())
        run_agent(team, "flaky", answering_round())
        assert run_agent(team, "flaky", held_round()).status == "needs_attention"
        make_agent("steady", workspace=team.workspace)
        run_agent(team, "steady", answering_round())
        run_agent(team, "steady", answering_round())
        make_agent("idle", workspace=team.workspace)
    return team


def rows(html: str) -> list[str]:
    return re.findall(r'<a class="agent-name" href="[^"]+">([^<]+)</a>', html)


def test_it_answers_each_role_and_hides_the_workspace_from_outsiders(fleet: Team) -> None:
    url = f"/w/{fleet.slug}/agents/"
    assert Client().get(url).status_code == 302
    assert client_for(fleet, "outsider").get(url).status_code == 404
    for role in ("viewer", "reader", "operator"):
        page = client_for(fleet, role).get(url)
        assert page.status_code == 200, role
        html = page.content.decode()
        assert rows(html) and set(rows(html)) == {"flaky", "steady", "idle"}
        # Kinds and counts for everyone; a failure's words for no one (the page holds none).
        assert "not_found" in html and "tracker_busy" in html
        assert SECRET not in html, role
        assert 'aria-current="page">Agents</a>' in html


@pytest.mark.spec("F18")
def test_its_numbers_are_the_scorecard_apis_for_the_same_window(fleet: Team) -> None:
    since = overview.window_start().isoformat()
    agents = {a["name"]: a for a in overview.agents_overview(fleet.workspace)}
    for name in ("flaky", "steady"):
        status, card = fleet.api("viewer").get(f"/insights/agents/{name}?since={since}&workspace={fleet.slug}")
        assert status == 200, card
        mine = agents[name]
        assert (mine["runs"], mine["failed"], mine["rate"]) == (card["runs"], card["failed"], card["rate"])
        assert {v["version"]: (v["runs"], v["failed"], v["rate"]) for v in mine["versions"]} == {
            v["version"]: (v["runs"], v["failed"], v["rate"]) for v in card["versions"]
        }
        assert [(k["kind"], k["failed"]) for k in mine["top_kinds"]] == [(k["kind"], k["failed"]) for k in card["by_kind"]][:3]
    flaky = agents["flaky"]
    assert (flaky["runs"], flaky["failed"], flaky["holds"]) == (7, 4, 1)
    assert flaky["versions"] == [
        {"version": 1, "runs": 3, "failed": 2, "rate": round(2 / 3, 4)},
        {"version": 2, "runs": 4, "failed": 2, "rate": 0.5},
    ]
    assert flaky["change"] == round(0.5 - round(2 / 3, 4), 4) and flaky["change_label"] == "-17 pts"
    assert agents["steady"]["change"] is None and agents["idle"]["runs"] == 0
    html = client_for(fleet, "viewer").get(f"/w/{fleet.slug}/agents/").content.decode()
    assert "-17 pts" in html and "v1→v2" in html


def test_it_links_each_agent_to_its_scorecard_and_findings_searches(fleet: Team) -> None:
    viewer = client_for(fleet, "viewer")
    html = viewer.get(f"/w/{fleet.slug}/agents/").content.decode()
    assert f'href="/w/{fleet.slug}/agents/flaky/"' in html
    since = overview.window_start().isoformat()
    search = re.search(r'href="(/w/[^"]+/agents/flaky/\?q=finding%3Afailure_not_found[^"]*)"', html)
    assert search, html
    assert f"since%3A{since}" in search.group(1)
    hit = viewer.get(search.group(1).replace("&amp;", "&"))
    assert hit.status_code == 200 and "No findings match" not in hit.content.decode()


def test_it_draws_a_sized_chart_of_each_versions_rate(fleet: Team) -> None:
    html = client_for(fleet, "reader").get(f"/w/{fleet.slug}/agents/?sort=name").content.decode()
    charts = re.findall(r'<svg class="spark" width="(\d+)" height="(\d+)" viewBox="0 0 \d+ \d+".*?</svg>', html, re.S)
    assert charts == [(str(overview.SPARK_W), str(overview.SPARK_H))] * 2  # flaky and steady; idle has no runs
    flaky_chart = re.search(r'aria-label="failure rate per version of flaky".*?</svg>', html, re.S)
    assert flaky_chart
    bars = re.findall(r'<rect class="spark-bar" x="[\d.]+" y="[\d.]+" width="[\d.]+" height="([\d.]+)">', flaky_chart.group(0))
    assert len(bars) == 2 and float(bars[0]) > float(bars[1]) > 0  # v1 failed more than v2
    assert "style=" not in html and "<script>" not in html.split("</head>")[1]  # CSP: no inline styles or scripts


def test_it_sorts_by_a_whitelisted_column_and_defaults_on_anything_else(fleet: Team) -> None:
    operator = client_for(fleet, "operator")

    def order(query: dict[str, Any]) -> list[str]:
        page = operator.get(f"/w/{fleet.slug}/agents/", query)
        assert page.status_code == 200, query
        return rows(page.content.decode())

    assert order({"sort": "name"}) == ["flaky", "idle", "steady"]
    assert order({"sort": "runs"}) == ["flaky", "steady", "idle"]
    assert order({"sort": "holds"})[0] == "flaky"
    default = order({})
    assert default == ["flaky", "steady", "idle"]  # the highest failure rate first; no runs last
    for bad in ("Rate", "-rate", "rate; DROP TABLE runs_run", "x" * 100_000, "%ff", "../name", "é"):
        assert order({"sort": bad}) == default, bad
    # A NUL byte is refused before any view, as everywhere in the console: a 400, never a 500.
    assert operator.get(f"/w/{fleet.slug}/agents/", {"sort": "\x00"}).status_code == 400
    assert order({"sort": ["name", "runs"]}) in (["flaky", "steady", "idle"], ["flaky", "idle", "steady"])
    fragment = operator.get(f"/w/{fleet.slug}/agents/", {"sort": "name"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in fragment and rows(fragment) == ["flaky", "idle", "steady"]
    assert Run.objects.filter(workspace=fleet.workspace).count() == 9  # reading wrote nothing


def test_its_query_count_does_not_grow_with_agents_or_findings(team: Team) -> None:
    viewer = client_for(team, "viewer")
    make_agent("one", workspace=team.workspace)
    run_agent(team, "one", oz_fail_round("not_found"))
    viewer.get(f"/w/{team.slug}/agents/")  # warm the session and content-type caches
    with CaptureQueriesContext(connection) as few:
        assert viewer.get(f"/w/{team.slug}/agents/").status_code == 200
    for index in range(4):
        make_agent(f"more-{index}", workspace=team.workspace, versions=2)
        for _ in range(3):
            run_agent(team, f"more-{index}", oz_fail_round("not_found"))
    with CaptureQueriesContext(connection) as many:
        assert viewer.get(f"/w/{team.slug}/agents/").status_code == 200
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
    assert len(overview.agents_overview(team.workspace)) == 5


def test_a_workspace_without_agents_says_so(team: Team) -> None:
    html = client_for(team, "viewer").get(f"/w/{team.slug}/agents/").content.decode()
    assert "No agents in this workspace yet." in html


@pytest.mark.spec("F18")
def test_the_scorecard_shows_each_kinds_rate_per_version(fleet: Team) -> None:
    html = client_for(fleet, "viewer").get(f"/w/{fleet.slug}/agents/flaky/").content.decode()
    timeline = re.search(r'<svg class="chart timeline" width="\d+" height="\d+".*?</svg>', html, re.S)
    assert timeline, html
    svg = timeline.group(0)
    assert re.findall(r'class="tick"[^>]*>(v\d)</text>', svg) == ["v1", "v2"]
    titles = re.findall(r"<title>([^<]+)</title>", svg)
    # v1 made not_found its failure, v2 none of it and a tracker_busy instead: both steps show.
    assert "v1 not_found: 2 of 3 runs (67%)" in titles and "v2 not_found: 0 of 4 runs (0%)" in titles
    assert "v1 tracker_busy: 0 of 3 runs (0%)" in titles and "v2 tracker_busy: 1 of 4 runs (25%)" in titles
    assert SECRET not in html
