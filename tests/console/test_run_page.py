"""The run page an operator can read at any size (issue 30): fan-outs as groups with their counts,
a task table paged and filtered by status and group with each task's times on the run's
timeline, the trace newest first, paged and filtered by task and event, and a task drawer
with arguments, result, error, attempts, provider calls and stderr, each redacted by role."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from runs import kernel
from runs.models import Run, Task, TraceEvent
from runs.run_page import GRAPH_NODES, TASKS_PER_PAGE, TRACE_PAGE
from tests.conftest import Team
from tests.console import states

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
SECRET_ARG = "the-secret-argument"
SECRET_STDERR = "harness said the-secret-stderr"
SECRET_PROMPT = "the-secret-prompt"
SECRET_ANSWER = "the-secret-answer"


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<span class="ev-seq mono">#(\d+)</span>', html)]


def task_rows(html: str) -> list[str]:
    table = html[html.index('<table class="tasks">') :]
    return re.findall(r'<tr data-task="([^"]+)"', table[: table.index("</table>")])


def fan_run(team: Team, *, members: int = 60, private: bool = False) -> Run:
    """A run of `members` echoes `e0`… (one fan-out) and a join `j` after the first 8."""
    tasks: list[dict[str, Any]] = [
        {"key": f"e{i}", "kind": "tool", "tool": "test.echo", "args": {"value": SECRET_ARG}, "after": []} for i in range(members)
    ]
    tasks.append(
        {
            "key": "j",
            "kind": "tool",
            "tool": "test.echo",
            "args": {"value": 1},
            "after": [f"e{i}" for i in range(min(8, members))],
        }
    )
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": tasks, "deliverable": "j", "private": private}
    )
    return run


def complete(run: Run, key: str, **extra: Any) -> None:
    claimed = kernel.claim_task(None, states.task(run, key).pk, f"claim-{key}")
    assert claimed is not None
    assert kernel.task_complete(claimed, {"value": SECRET_ANSWER}, extra=extra)


def fail(run: Run, key: str, detail: str) -> None:
    claimed = kernel.claim_task(None, states.task(run, key).pk, f"claim-{key}")
    assert claimed is not None
    assert kernel.task_fail(claimed, "tool_failed", detail)


def worked_run(team: Team, *, private: bool = False) -> Run:
    """A fan run whose `e0` completed with a provider call and stderr, and `e1` failed."""
    run = fan_run(team, private=private)
    call = {"route": "script", "attempt": 1, "outcome": "answer", "request": {"messages": [SECRET_PROMPT]}}
    complete(run, "e0", stderr=SECRET_STDERR, provider_calls=[call], usage={"input_tokens": 7, "output_tokens": 3, "calls": 1})
    fail(run, "e1", "boom: the-secret-detail")
    return Run.objects.get(pk=run.pk)


def busy_run(team: Team) -> Run:
    """A worked run with more than a page of trace events: 30 more echoes done."""
    run = worked_run(team)
    for i in range(10, 40):
        complete(run, f"e{i}")
    return Run.objects.get(pk=run.pk)


# ---- the role matrix of every new view and query ----


@pytest.mark.parametrize(
    "path",
    [
        "/runs/{run}/",
        "/runs/{run}/?status=failed&page=1",
        "/runs/{run}/trace/",
        "/runs/{run}/trace/?before=3",
        "/runs/{run}/tasks/e0/",
    ],
)
def test_it_holds_the_role_matrix(team: Team, path: str) -> None:
    run = worked_run(team)
    url = path.format(run=run.pk)
    assert Client().get(url).status_code == 302  # to the sign-in
    assert client_for(team, "outsider").get(url).status_code == 404
    assert client_for(team, "outsider").get(url, **HTMX).status_code == 404
    for role in ("viewer", "reader", "operator"):
        assert client_for(team, role).get(url).status_code == 200, role
        assert client_for(team, role).get(url, **HTMX).status_code == 200, role


def test_it_refuses_writes_to_its_views(team: Team) -> None:
    run = worked_run(team)
    for url in (f"/runs/{run.pk}/trace/", f"/runs/{run.pk}/tasks/e0/"):
        assert client_for(team, "operator").post(url).status_code == 405


@pytest.mark.parametrize(
    ("path", "query", "key"),
    [
        ("/runs/{run}/", {"status": "bogus"}, "invalid_status"),
        ("/runs/{run}/", {"status": "<b>"}, "invalid_status"),
        ("/runs/{run}/", {"page": "0"}, "invalid_page"),
        ("/runs/{run}/", {"page": "-1"}, "invalid_page"),
        ("/runs/{run}/", {"page": "1e3"}, "invalid_page"),
        ("/runs/{run}/", {"page": "99999999999999999999"}, "invalid_page"),
        ("/runs/{run}/", {"group": "e"}, "invalid_group"),
        ("/runs/{run}/", {"group": "e*x"}, "invalid_group"),
        ("/runs/{run}/", {"group": "a/b*0"}, "invalid_group"),
        ("/runs/{run}/", {"after": "x"}, "invalid_after"),
        ("/runs/{run}/", {"task": "../x"}, "invalid_task"),
        ("/runs/{run}/", {"event": "DROP TABLE"}, "invalid_event"),
        ("/runs/{run}/trace/", {"before": "-5"}, "invalid_before"),
        ("/runs/{run}/trace/", {"before": "9223372036854775808"}, "invalid_before"),
        ("/runs/{run}/trace/", {"before": "٣"}, "invalid_before"),
        ("/runs/{run}/trace/", {"task": " e0"}, "invalid_task"),
        ("/runs/{run}/trace/", {"event": "x" * 41}, "invalid_event"),
    ],
)
def test_a_bad_query_value_is_a_typed_400(team: Team, path: str, query: dict[str, str], key: str) -> None:
    run = fan_run(team, members=10)
    for headers in ({}, HTMX):
        response = client_for(team, "reader").get(path.format(run=run.pk), query, **headers)
        assert response.status_code == 400 and response.content.decode().startswith(f"{key}: ")


def test_a_task_that_is_not_there_is_a_404(team: Team) -> None:
    run = fan_run(team, members=10)
    assert client_for(team, "operator").get(f"/runs/{run.pk}/tasks/nope/").status_code == 404
    assert client_for(team, "operator").get(f"/runs/{run.pk}/tasks/%3Cb%3E/").status_code == 404


# ---- groups, the paged table, the timeline ----


def test_it_collapses_a_fan_out_into_a_group_with_its_counts_by_status(team: Team) -> None:
    run = worked_run(team)
    page = client_for(team, "viewer").get(f"/runs/{run.pk}/").content.decode()
    group = re.search(r'<tr class="group[^"]*" data-group="e\*0" data-status="failed">(.*?)</tr>', page, re.S)
    assert group is not None, "the 60 echoes are one group, shown as failed (its most pressing status)"
    counts = dict(re.findall(r'data-count="(\w+)">\w+ (\d+)<', group.group(1)))
    assert counts == {"failed": "1", "waiting": "58", "completed": "1"}
    svg = page[page.index('<svg class="graph"') : page.index("</svg>")]
    assert re.findall(r'<g class="node[^"]*" data-key="([^"]+)"', svg) == ["e*0", "j"]
    assert ">e* ×60</text>" in svg and svg.count('class="edge') == 1


def test_it_keeps_a_small_run_drawn_task_by_task(team: Team) -> None:
    run = fan_run(team, members=5)
    page = client_for(team, "viewer").get(f"/runs/{run.pk}/").content.decode()
    svg = page[page.index('<svg class="graph"') : page.index("</svg>")]
    assert re.findall(r'<g class="node[^"]*" data-key="([^"]+)"', svg) == ["e0", "e1", "e2", "e3", "e4", "j"]
    assert 'class="groups"' not in page


def test_it_pages_the_task_table(team: Team) -> None:
    run = fan_run(team)
    client = client_for(team, "viewer")
    first = client.get(f"/runs/{run.pk}/").content.decode()
    assert task_rows(first) == [f"e{i}" for i in range(TASKS_PER_PAGE)] and "page 1 of 2" in first
    second = client.get(f"/runs/{run.pk}/", {"page": 2}, **HTMX).content.decode()
    assert task_rows(second) == [f"e{i}" for i in range(TASKS_PER_PAGE, 60)] + ["j"]
    assert 'name="page" value="2"' in second  # the live refresh keeps the page
    beyond = client.get(f"/runs/{run.pk}/", {"page": 9}).content.decode()
    assert task_rows(beyond) == [] and "No task on page 9." in beyond


def test_it_filters_the_task_table_by_status_and_group(team: Team) -> None:
    run = worked_run(team)
    client = client_for(team, "reader")
    failed = client.get(f"/runs/{run.pk}/", {"status": "failed"}, **HTMX).content.decode()
    assert task_rows(failed) == ["e1"] and 'name="status" value="failed"' in failed
    in_group = client.get(f"/runs/{run.pk}/", {"group": "e*0", "page": 2}).content.decode()
    assert task_rows(in_group) == [f"e{i}" for i in range(TASKS_PER_PAGE, 60)]
    both = client.get(f"/runs/{run.pk}/", {"group": "e*0", "status": "completed"}).content.decode()
    assert task_rows(both) == ["e0"]
    unknown = client.get(f"/runs/{run.pk}/", {"group": "zz*3"}).content.decode()
    assert task_rows(unknown) == [] and "No task matches this filter." in unknown


def test_it_keeps_an_unchanged_filtered_page_a_204(team: Team) -> None:
    run = worked_run(team)
    client = client_for(team, "operator")
    page = client.get(f"/runs/{run.pk}/", {"status": "waiting", "page": 2}, **HTMX).content.decode()
    state = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page.split('class="live-state"')[1]))
    assert state["status"] == "waiting" and state["page"] == "2"
    assert client.get(f"/runs/{run.pk}/", state, **HTMX).status_code == 204
    complete(run, "e55")
    changed = client.get(f"/runs/{run.pk}/", state, **HTMX)
    assert changed.status_code == 200 and "e55" not in task_rows(changed.content.decode())


def test_it_shows_each_task_on_the_timeline_and_the_run_duration(team: Team) -> None:
    run = worked_run(team)
    e0 = states.task(run, "e0")
    assert e0.queued_at is None or e0.queued_at <= e0.started_at  # type: ignore[operator]
    page = client_for(team, "viewer").get(f"/runs/{run.pk}/").content.decode()
    row = re.search(r'<tr data-task="e0" data-status="completed">(.*?)</tr>', page, re.S)
    assert row is not None
    times = re.search(r'<td class="small mono times">(.*?)</td>', row.group(1))
    assert times is not None
    assert times.group(1).split(" · ")[1:] == [
        e0.started_at.astimezone().strftime("%H:%M:%S"),  # type: ignore[union-attr]
        e0.finished_at.astimezone().strftime("%H:%M:%S"),  # type: ignore[union-attr]
    ]
    assert re.search(r'<rect class="bar-work status-completed" x="[\d.]+" y="0" width="[\d.]+"', row.group(1))
    waiting = re.search(r'<tr data-task="e5" data-status="waiting">(.*?)</tr>', page, re.S)
    assert waiting is not None and "bar-work" not in waiting.group(1)
    assert "running for <time" in page  # an open run's duration ticks in the browser
    Run.objects.filter(pk=run.pk).update(finished_at=run.created_at + (e0.finished_at - run.created_at) * 2)  # type: ignore[operator]
    done = client_for(team, "viewer").get(f"/runs/{run.pk}/").content.decode()
    assert re.search(r'took <span id="run-duration">[\d.]+s</span>', done)


def test_it_bounds_a_big_run_page(team: Team) -> None:
    """Thousands of tasks: the page holds a page of rows, a graph of at most GRAPH_NODES nodes and
    a page of the trace, whatever the run's size (the bench's `runpage` measures the browser)."""
    run = fan_run(team, members=60)
    rows = [
        Task(
            run=run,
            key=f"solo-{chr(97 + i % 26)}{i // 26}x",
            kind="tool",
            spec={"tool": "test.echo"},
            lineage="l",
            position=100 + i,
        )
        for i in range(GRAPH_NODES + 40)
    ]
    Task.objects.bulk_create(rows)
    page = client_for(team, "viewer").get(f"/runs/{run.pk}/").content.decode()
    svg = page[page.index('<svg class="graph"') : page.index("</svg>")]
    assert svg.count('<g class="node') == GRAPH_NODES
    assert f"{GRAPH_NODES + 40 + 2 - GRAPH_NODES} more nodes past the first {GRAPH_NODES}" in page
    assert len(task_rows(page)) == TASKS_PER_PAGE and len(seqs(page)) <= TRACE_PAGE


# ---- the trace: newest first, paged, filtered ----


def test_it_pages_the_trace_beyond_its_first_page(team: Team) -> None:
    run = busy_run(team)
    total = TraceEvent.objects.filter(run=run).count()
    assert total > TRACE_PAGE, total
    client = client_for(team, "viewer")
    page = client.get(f"/runs/{run.pk}/").content.decode()
    first = seqs(page)
    assert first == list(range(total, total - TRACE_PAGE, -1)) and f"{total} events, newest first" in page
    shown, html = list(first), page
    while (older_url := re.search(r'hx-get="(/runs/[^"]+/trace/\?before=(\d+))"', html)) is not None:
        assert int(older_url.group(2)) == shown[-1]  # the next page starts before the last row shown
        html = client.get(older_url.group(1), **HTMX).content.decode()
        assert 0 < len(seqs(html)) <= TRACE_PAGE
        shown += seqs(html)
    assert shown == list(range(total, 0, -1))  # every event once, newest first, to the first
    assert '<div id="trace-older" hx-swap-oob="true"><p class="muted small">The first event.</p>' in html


def test_it_filters_the_trace_by_task_and_event(team: Team) -> None:
    run = worked_run(team)
    client = client_for(team, "viewer")
    by_task = client.get(f"/runs/{run.pk}/trace/", {"task": "e1"}, **HTMX).content.decode()
    expected = list(TraceEvent.objects.filter(run=run, task_key="e1").order_by("-seq").values_list("seq", flat=True))
    assert seqs(by_task) == expected and expected
    assert '<input type="hidden" name="task" value="e1">' in by_task
    calls = client.get(f"/runs/{run.pk}/trace/", {"event": "provider_call"}, **HTMX).content.decode()
    assert len(seqs(calls)) == 1 and "provider call" in calls
    none = client.get(f"/runs/{run.pk}/trace/", {"event": "no_such_event"}, **HTMX).content.decode()
    assert seqs(none) == [] and "No events match this filter." in none


def test_the_live_refresh_keeps_the_trace_filter(team: Team) -> None:
    run = worked_run(team)
    client = client_for(team, "viewer")
    page = client.get(f"/runs/{run.pk}/").content.decode()
    last = max(seqs(page))
    complete(run, "e7")
    complete(run, "e8")
    refresh = client.get(f"/runs/{run.pk}/", {"after": last, "task": "e8"}, **HTMX).content.decode()
    new = list(TraceEvent.objects.filter(run=run, task_key="e8", seq__gt=last).order_by("-seq").values_list("seq", flat=True))
    assert seqs(refresh) == new and new
    assert '<ol id="trace-rows" hx-swap-oob="afterbegin">' in refresh


def test_a_gap_of_more_than_a_page_replaces_the_trace(team: Team) -> None:
    run = busy_run(team)
    refresh = client_for(team, "viewer").get(f"/runs/{run.pk}/", {"after": 1}, **HTMX).content.decode()
    assert '<div id="trace-list" hx-swap-oob="innerHTML">' in refresh and "afterbegin" not in refresh
    total = TraceEvent.objects.filter(run=run).count()
    assert seqs(refresh) == list(range(total, total - TRACE_PAGE, -1))


# ---- the drawer, redacted by role (F11, F12) ----


@pytest.mark.spec("F11", "F12")
def test_the_drawer_shows_a_reader_the_task_whole(team: Team) -> None:
    run = worked_run(team)
    client = client_for(team, "reader")
    drawer = client.get(f"/runs/{run.pk}/tasks/e0/", **HTMX).content.decode()
    for words in (SECRET_ARG, SECRET_STDERR, SECRET_PROMPT, SECRET_ANSWER):
        assert words in drawer, words
    assert 'id="drawer-call-' in drawer and "attempt 1" in drawer and "<html" not in drawer
    assert '<dd class="mono small" id="drawer-took">' in drawer
    failed = client.get(f"/runs/{run.pk}/tasks/e1/", **HTMX).content.decode()
    assert "tool_failed" in failed and "the-secret-detail" in failed
    assert "<html" in client.get(f"/runs/{run.pk}/tasks/e0/").content.decode()  # alone, without htmx


@pytest.mark.spec("F11", "F12")
@pytest.mark.parametrize(("role", "private"), [("viewer", False), ("reader", True)])
def test_the_drawer_redacts_the_words_from_a_closed_reader(team: Team, role: str, private: bool) -> None:
    run = worked_run(team, private=private)
    client = client_for(team, role)
    for key in ("e0", "e1"):
        drawer = client.get(f"/runs/{run.pk}/tasks/{key}/", **HTMX).content.decode()
        for words in (SECRET_ARG, SECRET_STDERR, SECRET_PROMPT, SECRET_ANSWER, "the-secret-detail"):
            assert words not in drawer, (key, words)
        # Someone else's private run is told apart from a role that reads no words (issue 30.8).
        creator = team.users["operator"].username
        assert (f"hidden: this is a private run of {creator}" if private else "hidden from your role") in drawer
    assert "tool_failed" in client.get(f"/runs/{run.pk}/tasks/e1/").content.decode()  # the kind stays
    for url in (f"/runs/{run.pk}/", f"/runs/{run.pk}/trace/?task=e0", f"/runs/{run.pk}/?group=e*0&status=failed"):
        page = client.get(url).content.decode()
        for words in (SECRET_ARG, SECRET_STDERR, SECRET_PROMPT, SECRET_ANSWER, "the-secret-detail"):
            assert words not in page, (url, words)
