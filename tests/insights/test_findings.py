"""F18: a failed run's finding keeps its kind, step and attempts, never its words; job search finds it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any
from urllib.parse import quote

import pytest
from django.core.management import CommandError, call_command

from runs.models import Finding, Run
from tests.factories import make_member, make_token, make_workspace
from tests.insights.conftest import oz_fail_round, run_agent
from tests.insights.planting import make_agent

pytestmark = pytest.mark.django_db


def finding(team: Any, **fields: Any) -> Finding:
    values: dict[str, Any] = {
        "run_id": "00000000-0000-0000-0000-000000000001",
        "workspace_id": team.workspace.pk,
        "agent_name": "triage",
        "agent_version": 1,
        "kind": "not_found",
        "step_key": "r1",
        "step_kind": "round",
        "attempts": 1,
        "created_at": datetime(2026, 3, 10, 12, tzinfo=UTC),
    }
    values.update(fields)
    import uuid

    values["run_id"] = fields.get("run_id", uuid.uuid4())
    return Finding.objects.create(**values)


def kinds_of(page: dict[str, Any]) -> list[str]:
    return [item["kind"] for item in page["items"]]


@pytest.mark.spec("F18", "F11")
def test_it_keeps_a_failed_runs_kind_step_and_attempts_but_not_its_words(team: Any) -> None:
    make_agent("triage-words", workspace=team.workspace)
    run = run_agent(team, "triage-words", oz_fail_round("not_found", "customer ACME-7 has no issue"))
    assert run.status == "canceled"
    status, page = team.api("viewer").get("/findings?q=finding:failure_not_found")
    assert status == 200
    [item] = page["items"]
    assert item["run"] == str(run.pk)
    assert item["kind"] == "not_found" and item["declared"] is True and item["person"] is True
    assert item["step"] == {"key": "r1", "kind": "round"} and item["attempts"] == 1
    assert item["agent"] == "triage-words" and item["version"] == 1 and item["workspace"] == team.slug
    assert "ACME-7" not in json.dumps(page)


@pytest.mark.spec("F18")
def test_it_combines_kind_agent_version_dates_and_step(team: Any) -> None:
    finding(team, kind="not_found", agent_name="triage", agent_version=1)
    finding(team, kind="not_found", agent_name="triage", agent_version=2, step_key="fetch", step_kind="tool")
    finding(team, kind="not_found", agent_name="other", agent_version=2)
    finding(team, kind="timeout", agent_name="triage", agent_version=2, created_at=datetime(2026, 4, 1, tzinfo=UTC))
    api = team.api("reader")

    def search(q: str) -> list[tuple[str, str, int]]:
        status, page = api.get(f"/findings?q={quote(q)}")
        assert status == 200, page
        return sorted((i["kind"], i["agent"], i["version"]) for i in page["items"])

    assert search("finding:failure_not_found agent:triage") == [("not_found", "triage", 1), ("not_found", "triage", 2)]
    assert search("finding:failure_not_found version:2") == [("not_found", "other", 2), ("not_found", "triage", 2)]
    assert search("agent:triage since:2026-03-11") == [("timeout", "triage", 2)]
    assert search("agent:triage until:2026-03-10") == [("not_found", "triage", 1), ("not_found", "triage", 2)]
    assert search("since:2026-03-10T12:00:00Z until:2026-03-10T12:00:00Z agent:other") == [("not_found", "other", 2)]
    assert search("step:fetch") == [("not_found", "triage", 2)]
    assert search("step_kind:tool finding:failure_not_found") == [("not_found", "triage", 2)]
    assert search("finding:failure_timeout finding:failure_not_found agent:other") == [("not_found", "other", 2)]
    assert len(search("")) == 4


@pytest.mark.spec("F18")
@pytest.mark.parametrize(
    ("q", "names"),
    [
        ("status:failed", "status"),
        ("agnet:triage", "agnet"),
        ("finding:Bad-Kind", "finding:Bad-Kind"),
        ("finding:failure_Bad-Kind", "finding:failure_Bad-Kind"),
        ("version:two", "version:two"),
        ("since:yesterday", "since:yesterday"),
        ("since:2026-01-01 since:2026-02-01", "once"),
        ("since:2026-02-01 until:2026-01-01", "after"),
        ("step_kind:banana", "step_kind:banana"),
        ('agent:"unclosed', "parse"),
        ("agent:", "no value"),
    ],
)
def test_it_refuses_a_query_it_does_not_understand(team: Any, q: str, names: str) -> None:
    finding(team)
    status, body = team.api("viewer").get(f"/findings?q={quote(q)}")
    assert status == 400
    assert body["error"]["key"] == "invalid_query"
    assert names in body["error"]["detail"]


@pytest.mark.spec("F18")
def test_it_pages_newest_first_by_keyset(team: Any) -> None:
    moment = datetime(2026, 5, 1, tzinfo=UTC)
    made = [finding(team, created_at=moment - timedelta(hours=i // 2)) for i in range(7)]  # pairs share a created_at
    seen: list[int] = []
    cursor = ""
    for _ in range(5):
        status, page = team.api("viewer").get(f"/findings?limit=3&cursor={cursor}")
        assert status == 200
        seen += [item["id"] for item in page["items"]]
        if not page["next"]:
            break
        cursor = page["next"]
    expected = [f.pk for f in sorted(made, key=lambda f: (f.created_at, f.pk), reverse=True)]
    assert seen == expected
    status, body = team.api("viewer").get("/findings?cursor=not-a-cursor")
    assert status == 400 and body["error"]["key"] == "invalid_cursor"


@pytest.mark.spec("F18")
def test_it_shows_findings_to_members_of_their_workspace_only(team: Any) -> None:
    other = make_workspace()
    finding(team, kind="limit")
    finding(team, kind="budget", workspace_id=other.pk)
    status, page = team.api("viewer").get("/findings")
    assert kinds_of(page) == ["limit"]
    status, page = team.api("outsider").get("/findings")
    assert status == 200 and page["items"] == []
    both = make_member(workspace=other, role="viewer")
    from tests.conftest import Api

    api = Api(make_token(user=both))
    from tenancy.models import Membership

    Membership.objects.create(workspace=team.workspace, user=both, role="viewer")
    status, page = api.get(f"/findings?workspace={other.slug}")
    assert kinds_of(page) == ["budget"]
    status, page = api.get(f"/findings?q=workspace:{team.slug}")
    assert kinds_of(page) == ["limit"]
    status, body = team.api("viewer").get(f"/findings?workspace={other.slug}")
    assert status == 404
    status, body = team.api("viewer").get(f"/findings?q=workspace:{other.slug}")
    assert status == 200 and body["items"] == []


@pytest.mark.spec("F18")
def test_it_keeps_findings_searchable_after_the_run_is_deleted(team: Any) -> None:
    make_agent("short-lived", workspace=team.workspace)
    run = run_agent(team, "short-lived", oz_fail_round("not_found", "gone soon"))
    run_id = str(run.pk)
    Run.objects.filter(pk=run.pk).delete()
    status, page = team.api("viewer").get("/findings?q=" + quote("finding:failure_not_found agent:short-lived"))
    assert [item["run"] for item in page["items"]] == [run_id]
    status, card = team.api("viewer").get("/insights/agents/short-lived")
    assert status == 200 and card["failed"] == 1 and card["runs"] == 1


@pytest.mark.spec("F18")
def test_it_searches_from_the_command_line(team: Any) -> None:
    finding(team, kind="not_found", agent_name="triage", step_key="fetch", step_kind="tool", error_key="tool_failed", attempts=3)
    finding(team, kind="timeout", agent_name="triage")
    out = StringIO()
    call_command("job_search", "finding:failure_not_found", "agent:triage", stdout=out)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["created_at", "workspace", "agent", "version", "kind"]
    assert "not_found" in lines[1] and "fetch (tool)" in lines[1] and "tool_failed" in lines[1]
    assert "timeout" not in text and "1 finding(s)" in text
    out = StringIO()
    call_command("job_search", "finding:failure_timeout", "--json", f"--workspace={team.slug}", stdout=out)
    assert [i["kind"] for i in json.loads(out.getvalue())["items"]] == ["timeout"]
    with pytest.raises(CommandError, match="invalid_query"):
        call_command("job_search", "colour:blue", stdout=StringIO())
    with pytest.raises(CommandError, match="no such workspace"):
        call_command("job_search", "--workspace=nope", stdout=StringIO())
