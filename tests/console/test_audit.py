"""The audit trail: every verb done through the kernel shows up with its actor, run and task,
per workspace, filtered and paged by keyset, redacted by role, and exported as safe CSV."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from runs import kernel
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.console import states
from tests.runs.driver import drive

# No module-wide django_db mark: the `team` fixture opens the rolled-back database for the API
# and page tests, and the browser test needs committed rows that daphne can see.
SECRET = "secret-words-of-the-approver"


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def halted(team: Team, detail: str = "boom") -> Run:
    return states.halted_run(team.workspace, team.users["operator"], detail=detail)


def overflowed_round(team: Team) -> Run:
    """A round that failed after a tool call: a compaction candidate."""
    script = [
        {"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]},
        {"finish": "error", "word": "garbled"},
        {"text": "repaired"},
    ]
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={
            "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script, "on_failure": "halt"}],
            "deliverable": "r1",
            "approval": {"mode": "bypass"},
        },
    )
    return drive(run)


def open_run(team: Team) -> tuple[Run, dict[str, Any]]:
    """A run waiting on a client await `gate` (pending work that can be paused, appended to, resolved)."""
    return kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "gate", "kind": "await", "question": "go?"}], "deliverable": "gate"},
    )


def every_verb(team: Team) -> dict[str, tuple[Run, str | None]]:
    """Each verb done once through the kernel, by the operator: verb → (run, task key)."""
    operator = team.users["operator"]
    done: dict[str, tuple[Run, str | None]] = {}

    run = states.approval_run(team.workspace, operator)
    kernel.approve(run_id=run.pk, key="r1.1", user=operator)
    done["approve"] = (run, "r1.1")

    run = states.approval_run(team.workspace, operator)
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason=f"=cmd|' /C calc'!A0 {SECRET}")
    done["deny"] = (run, "r1.1")

    run = states.question_run(team.workspace, operator)
    asked = Task.objects.get(run=run, status="awaiting_input")
    kernel.answer(run_id=run.pk, key=asked.key, user=operator, value=f"eu-west, {SECRET}")
    done["answer"] = (run, asked.key)

    run = halted(team)
    kernel.retry(run_id=run.pk, key="a", user=operator)
    done["retry"] = (run, "a")

    run = halted(team)
    kernel.abandon(run_id=run.pk, key="a", user=operator)
    done["abandon"] = (run, "a")

    run = overflowed_round(team)
    kernel.compact(run_id=run.pk, key="r1", user=operator)
    done["compact"] = (run, "r1")

    run, receipt = open_run(team)
    kernel.pause_run(run_id=run.pk, user=operator)
    done["pause"] = (run, None)
    kernel.resume_run(run_id=run.pk, user=operator)
    done["resume"] = (run, None)
    kernel.append(
        run_id=run.pk,
        user=operator,
        body={"tasks": [{"key": "later", "kind": "tool", "tool": "test.echo", "args": {"value": 1}}]},
    )
    done["append"] = (run, None)
    kernel.resolve_await(token=receipt["tokens"]["gate"], user=operator, value={"approved_by": SECRET})
    done["resolve"] = (run, "gate")

    run = halted(team)
    kernel.cancel_run(run_id=run.pk, user=operator, reason=f"wrong input, {SECRET}")
    done["cancel"] = (run, None)
    return done


def trail(team: Team, role: str = "operator", query: str = "") -> list[dict[str, Any]]:
    status, page = team.api(role).get(f"/workspaces/{team.slug}/audit?limit=200{query}")
    assert status == 200, page
    assert page["next"] is None
    return list(page["items"])


@pytest.mark.spec("F11", "F12")
def test_it_records_every_verb_with_its_actor_run_and_task(team: Team) -> None:
    done = every_verb(team)
    entries = trail(team)
    by_verb = {e["verb"]: e for e in entries}
    assert set(by_verb) == {
        "approve",
        "deny",
        "answer",
        "resolve",
        "retry",
        "abandon",
        "compact",
        "append",
        "cancel",
        "pause",
        "resume",
    }
    operator = team.users["operator"].username
    for verb, (run, key) in done.items():
        entry = by_verb[verb]
        assert entry["actor"] == operator, entry
        assert entry["run"] == str(run.pk), entry
        assert entry["task"] == key, entry
        assert entry["content_visible"] is True
    assert SECRET in by_verb["deny"]["reason"] and by_verb["deny"]["reason"].startswith("=cmd")
    assert by_verb["cancel"]["reason"] == f"wrong input, {SECRET}"
    assert by_verb["answer"]["answer"] == f"eu-west, {SECRET}"
    assert by_verb["resolve"]["answer"] == {"approved_by": SECRET} and by_verb["resolve"]["outcome"] == "value"
    assert by_verb["append"]["tasks"] == ["later"]
    # Newest first: the last verb done is the first entry.
    assert entries[0]["verb"] == "cancel"
    stamps = [(e["at"], e["id"]) for e in entries]
    assert stamps == sorted(stamps, reverse=True)


def test_it_records_an_await_failure_with_its_words(team: Team) -> None:
    run, receipt = open_run(team)
    kernel.resolve_await(token=receipt["tokens"]["gate"], user=team.users["operator"], value=None, error=f"upstream {SECRET}")
    (entry,) = trail(team)
    assert (entry["verb"], entry["outcome"], entry["task"]) == ("resolve", "error", "gate")
    assert entry["reason"] == f"upstream {SECRET}" and entry["answer"] is None
    (viewer_entry,) = trail(team, "viewer")
    assert viewer_entry["reason"] is None


@pytest.mark.spec("F11", "F12")
def test_it_shows_each_role_the_trail_and_words_only_to_content_readers(team: Team) -> None:
    every_verb(team)
    assert team.api("outsider").get(f"/workspaces/{team.slug}/audit")[0] == 404
    assert team.api("outsider").get("/workspaces/no-such-workspace/audit")[0] == 404
    operator, reader, viewer = trail(team), trail(team, "reader"), trail(team, "viewer")
    assert [e["id"] for e in viewer] == [e["id"] for e in operator] == [e["id"] for e in reader]
    for entry in viewer:
        assert entry["content_visible"] is False and entry["reason"] is None and entry["answer"] is None
        assert entry["actor"] and entry["verb"] and entry["run"]
    assert SECRET not in json.dumps(viewer)
    assert SECRET in json.dumps(reader)
    # The console page says the same.
    assert client_for(team, "outsider").get(f"/w/{team.slug}/audit/").status_code == 404
    anonymous = Client().get(f"/w/{team.slug}/audit/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    viewer_page = client_for(team, "viewer").get(f"/w/{team.slug}/audit/").content.decode()
    reader_page = client_for(team, "reader").get(f"/w/{team.slug}/audit/").content.decode()
    assert SECRET not in viewer_page and "hidden from your role" in viewer_page and 'data-verb="deny"' in viewer_page
    assert SECRET in reader_page
    assert f'href="/w/{team.slug}/audit/"' in viewer_page  # the nav link, for every member


def test_it_keeps_a_private_runs_words_from_readers_who_did_not_create_it(team: Team) -> None:
    operator = team.users["operator"]
    run = states.approval_run(team.workspace, operator, private=True)
    kernel.deny(run_id=run.pk, key="r1.1", user=operator, reason=SECRET)
    (mine,) = trail(team)
    (theirs,) = trail(team, "reader")
    assert mine["reason"] == SECRET and mine["content_visible"] is True
    assert theirs["reason"] is None and theirs["content_visible"] is False and theirs["actor"] == operator.username


def test_it_keeps_each_workspace_to_its_own_trail(team: Team) -> None:
    other = Team()
    run = halted(other)
    kernel.abandon(run_id=run.pk, key="a", user=other.users["operator"])
    assert trail(team) == []
    assert [e["verb"] for e in trail(other)] == ["abandon"]


def test_it_filters_by_actor_verb_run_and_time(team: Team) -> None:
    done = every_verb(team)
    second = team.users["reader"]  # promoted for this test: a second actor
    from tenancy.models import Membership

    Membership.objects.filter(user=second, workspace=team.workspace).update(role="operator")
    second.__dict__.pop("_oz0_roles", None)
    run = halted(team)
    kernel.retry(run_id=run.pk, key="a", user=second)

    mine = trail(team, query=f"&actor={team.users['operator'].username}")
    assert len(mine) == 11 and {e["actor"] for e in mine} == {team.users["operator"].username}
    theirs = trail(team, query=f"&actor={second.username}")
    assert [(e["verb"], e["run"]) for e in theirs] == [("retry", str(run.pk))]
    assert [e["run"] for e in trail(team, query="&verb=retry")] == [str(run.pk), str(done["retry"][0].pk)]
    assert [e["verb"] for e in trail(team, query="&verb=append")] == ["append"]
    paused_run = done["pause"][0]
    assert {e["verb"] for e in trail(team, query=f"&run={paused_run.pk}")} == {"pause", "resume", "append", "resolve"}

    cancel_at = TraceEvent.objects.get(run=done["cancel"][0], event="verb", data__verb="cancel").at
    since = trail(team, query="&since=" + cancel_at.isoformat().replace("+", "%2B"))
    assert [e["verb"] for e in since] == ["retry", "cancel"]
    until = trail(team, query="&until=" + cancel_at.isoformat().replace("+", "%2B"))
    assert "cancel" not in {e["verb"] for e in until} and len(until) == 10
    future = (timezone.now() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert trail(team, query=f"&since={future}") == []
    assert trail(team, query=f"&actor=nobody-{uuid.uuid4().hex}") == []


def test_it_pages_by_cursor_to_the_end(team: Team) -> None:
    every_verb(team)
    everything = [e["id"] for e in trail(team)]
    seen: list[int] = []
    cursor = ""
    pages = 0
    while True:
        status, page = team.api("viewer").get(f"/workspaces/{team.slug}/audit?limit=3{cursor}")
        assert status == 200, page
        assert len(page["items"]) <= 3
        seen += [e["id"] for e in page["items"]]
        pages += 1
        if page["next"] is None:
            break
        cursor = f"&cursor={page['next']}"
    assert seen == everything and len(set(seen)) == 11 and pages == 4
    # limit is capped, and at least one.
    assert team.api().get(f"/workspaces/{team.slug}/audit?limit=100000")[0] == 200
    status, page = team.api().get(f"/workspaces/{team.slug}/audit?limit=0")
    assert status == 200 and len(page["items"]) == 1


def cursor_of(values: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "query",
    [
        "cursor=not-base64-%%%",
        "cursor=" + cursor_of({"at": "2026-01-01T00:00:00Z"}),
        "cursor=" + cursor_of(["not a time", 1]),
        "cursor=" + cursor_of(["2026-02-30T00:00:00Z", 1]),
        "cursor=" + cursor_of(["2026-01-01T00:00:00Z", "1"]),
        "cursor=" + cursor_of(["2026-01-01T00:00:00Z", True]),
        "cursor=" + cursor_of(["2026-01-01T00:00:00Z", 2**70]),
        "cursor=" + cursor_of(["2026-01-01T00:00:00Z", -5]),
        "cursor=" + cursor_of(["2026-01-01T00:00:00Z", 1, 2]),
        "cursor=" + cursor_of(["9999-12-31T23:59:59-23:59", 1]),
        "cursor=" + "A" * 5000,
        "cursor=" + cursor_of([[[[[[[]]]]]]]),
        "verb=delete",
        "verb=" + "x" * 10000,
        "run=not-a-run",
        "run=" + "443647d5-3556-44a3-9c19-4aa4121a67e5" + "-" * 30,
        "since=yesterday",
        "since=0.5",
        "until=1780000000",
        "since=2026-01-01T00:00:00",
        "until=2026-13-01T00:00:00Z",
        "since=" + "9" * 5000,
        "actor=" + "a" * 151,
        "limit=many",
    ],
)
def test_it_refuses_crafted_cursors_and_filters_typed(team: Team, query: str) -> None:
    run = halted(team)
    kernel.abandon(run_id=run.pk, key="a", user=team.users["operator"])
    before = TraceEvent.objects.count()
    status, body = team.api().get(f"/workspaces/{team.slug}/audit?{query}")
    assert status == 400, body
    assert body["error"]["key"] in ("invalid_cursor", "invalid_verb", "invalid_field", "invalid_request")
    assert TraceEvent.objects.count() == before
    # The page: a bad filter is a 400; a cursor not of ours starts again at the first page.
    page = client_for(team, "operator").get(f"/w/{team.slug}/audit/?{query}")
    assert page.status_code in (200, 400)
    if query.startswith("cursor="):
        assert page.status_code == 200 and 'data-verb="abandon"' in page.content.decode()


def csv_rows(team: Team, role: str, query: str = "") -> list[list[str]]:
    response = client_for(team, role).get(f"/w/{team.slug}/audit/?format=csv{query}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv") and response.streaming
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    return list(csv.reader(io.StringIO(text)))


@pytest.mark.spec("F11", "F12")
def test_it_exports_csv_with_a_header_no_formulas_and_the_same_redaction(team: Team) -> None:
    every_verb(team)
    run = halted(team)
    kernel.cancel_run(run_id=run.pk, user=team.users["operator"], reason="+SUM(A1:A9)")
    rows = csv_rows(team, "operator")
    header, body = rows[0], rows[1:]
    # The columns are a contract with the spreadsheets that read them: pinned here as one line.
    assert ",".join(header) == "at,actor,verb,run,task,agent,reason,answer,tasks,content_visible,edited,original_args,args,note"
    assert len(body) == 12
    column = {name: i for i, name in enumerate(header)}
    reasons = {r[column["verb"]] + r[column["run"]]: r[column["reason"]] for r in body}
    deny = next(r for r in body if r[column["verb"]] == "deny")
    assert deny[column["reason"]].startswith("'=cmd") and SECRET in deny[column["reason"]]
    assert reasons["cancel" + str(run.pk)] == "'+SUM(A1:A9)"
    for row in body:
        for cell in row:
            assert not cell.startswith(("=", "+", "-", "@")), row
    answer = next(r for r in body if r[column["verb"]] == "answer")
    assert answer[column["answer"]] == f"eu-west, {SECRET}"

    viewer = csv_rows(team, "viewer")
    assert len(viewer) == 13 and SECRET not in json.dumps(viewer) and "SUM" not in json.dumps(viewer)
    assert {r[column["content_visible"]] for r in viewer[1:]} == {"false"}
    # The filters apply to the export too.
    only_deny = csv_rows(team, "viewer", "&verb=deny")
    assert [r[column["verb"]] for r in only_deny[1:]] == ["deny"]
    assert client_for(team, "outsider").get(f"/w/{team.slug}/audit/?format=csv").status_code == 404


def test_it_exports_more_than_one_page(team: Team) -> None:
    operator = team.users["operator"]
    run, _ = open_run(team)
    for _ in range(120):
        kernel.pause_run(run_id=run.pk, user=operator)
        kernel.resume_run(run_id=run.pk, user=operator)
    rows = csv_rows(team, "reader")
    assert len(rows) == 1 + 240  # more than one chunk of the trail (200)
    assert [r[2] for r in rows[1:3]] == ["resume", "pause"]


def test_it_loads_more_rows_on_the_page(team: Team) -> None:
    operator = team.users["operator"]
    run, _ = open_run(team)
    for _ in range(30):
        kernel.pause_run(run_id=run.pk, user=operator)
        kernel.resume_run(run_id=run.pk, user=operator)
    page = client_for(team, "viewer").get(f"/w/{team.slug}/audit/?verb=pause").content.decode()
    assert page.count('data-verb="pause"') == 30 and "Load more" not in page
    viewer = client_for(team, "viewer")
    page = viewer.get(f"/w/{team.slug}/audit/").content.decode()
    assert page.count('<tr id="audit-') == 50 and "Load more" in page
    more = re.search(r'hx-get="([^"]*cursor=[^"]*)"', page)
    assert more is not None
    rest = viewer.get(more.group(1).replace("&amp;", "&"), HTTP_HX_REQUEST="true").content.decode()
    assert rest.count('<tr id="audit-') == 10 and "Load more" not in rest and "<html" not in rest


@pytest.mark.browser
@pytest.mark.live
@pytest.mark.usefixtures("committed")
def test_it_filters_the_page_by_actor_in_a_browser(live_team: Team, browsers: Any) -> None:
    from playwright.sync_api import expect

    from tests.factories import make_member

    operator = live_team.users["operator"]
    colleague = make_member(workspace=live_team.workspace, role="operator")
    run, _ = open_run(live_team)
    kernel.pause_run(run_id=run.pk, user=operator)
    kernel.resume_run(run_id=run.pk, user=colleague)

    browser = browsers()
    browser.sign_in(operator.username)
    inbox = browser.open(f"/w/{live_team.slug}/inbox/")
    inbox.click("nav.sections >> text=Audit")
    page = browser.page
    expect(page.locator("#audit-rows tr[data-verb]")).to_have_count(2)
    page.fill("input[name=actor]", colleague.username)
    page.click("#audit-filter button[type=submit]")
    expect(page.locator("#audit-rows tr[data-verb]")).to_have_count(1)
    row = page.locator("#audit-rows tr[data-verb]")
    expect(row).to_have_attribute("data-actor", colleague.username)
    expect(row).to_have_attribute("data-verb", "resume")
    assert f"actor={colleague.username}" in page.url
    expect(page.locator("#audit-csv")).to_have_attribute("href", re.compile(f"actor={colleague.username}.*format=csv"))
    browser.shot("audit")
    assert not [e for e in browser.errors if "Content Security Policy" in e], browser.errors
