"""The console's live refreshes send only what changed: the trace appends the events after a seq,
a live list the browser already shows answers 204; and every verb has its own view, each with
the same role matrix."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from console import urls as console_urls
from runs import kernel
from runs.models import TraceEvent
from tests.conftest import Team
from tests.console import states

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<span class="ev-seq mono">#(\d+)</span>', html)]


def live_state(html: str) -> dict[str, str]:
    """What the live container sends back with its next refresh."""
    state = re.search(r'<div class="live-state" hidden>(.*?)</div>', html)
    assert state is not None
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', state.group(1)))


def trace_state(html: str) -> dict[str, str]:
    """The trace's position and filter, which the run page's live refresh sends with its own state."""
    state = re.search(r'<div class="trace-state" hidden[^>]*>(.*?)</div>', html)
    assert state is not None
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', state.group(1)))


def test_the_trace_puts_only_the_events_after_a_seq_on_top(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    last = TraceEvent.objects.filter(run=run).order_by("-seq").values_list("seq", flat=True)[0]
    assert last > 3
    client = client_for(team, "reader")
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert seqs(page) == list(range(last, 0, -1))  # newest first
    assert trace_state(page) == {"after": str(last), "task": "", "event": ""} and f"{last} events" in page

    later = client.get(f"/runs/{run.pk}/", {"after": 3}, **HTMX).content.decode()
    assert seqs(later) == list(range(last, 3, -1))
    assert '<ol id="trace-rows" hx-swap-oob="afterbegin">' in later
    assert trace_state(later)["after"] == str(last)
    assert 'class="run-head"' in later  # the regions come with them

    none_later = client.get(f"/runs/{run.pk}/", {"after": last}, **HTMX).content.decode()
    assert seqs(none_later) == [] and "trace-rows" not in none_later and "trace-state" not in none_later


@pytest.mark.parametrize("after", ["-1", "abc", "1.5", "1e3", "", " 3", "99999999999999999999", "9223372036854775808", "٣"])
def test_a_bad_after_is_a_400(team: Team, after: str) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    client = client_for(team, "reader")
    assert client.get(f"/runs/{run.pk}/", {"after": after}, **HTMX).status_code == 400
    assert client.get(f"/runs/{run.pk}/", {"after": after}).status_code == 400


def test_an_after_past_the_end_is_an_empty_answer(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    client = client_for(team, "reader")
    response = client.get(f"/runs/{run.pk}/", {"after": str(2**63 - 1)}, **HTMX)
    assert response.status_code == 200 and seqs(response.content.decode()) == []


def test_the_trace_is_hidden_from_outsiders_whatever_the_after(team: Team) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    assert client_for(team, "outsider").get(f"/runs/{run.pk}/", {"after": 1}, **HTMX).status_code == 404


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_an_unchanged_live_list_answers_204(team: Team, role: str) -> None:
    run = states.approval_run(team.workspace, team.users["operator"])
    states.halted_run(team.workspace, team.users["operator"])
    client = client_for(team, role)
    for url in (f"/w/{team.slug}/inbox/", f"/w/{team.slug}/holds/", f"/w/{team.slug}/runs/", f"/runs/{run.pk}/"):
        page = client.get(url).content.decode()
        unchanged = client.get(url, live_state(page), **HTMX)
        assert unchanged.status_code == 204 and unchanged.content == b"", url
        assert "HX-Request" in unchanged["Vary"]
        assert client.get(url, {"seen": "0" * 32}, **HTMX).status_code == 200, url


def test_a_live_list_answers_again_once_something_changed(team: Team) -> None:
    run = states.approval_run(team.workspace, team.users["operator"])
    client = client_for(team, "operator")
    inbox = client.get(f"/w/{team.slug}/inbox/").content.decode()
    run_page = client.get(f"/runs/{run.pk}/").content.decode()
    after = max(seqs(run_page))
    assert trace_state(run_page)["after"] == str(after)
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"])

    refreshed = client.get(f"/w/{team.slug}/inbox/", live_state(inbox), **HTMX)
    assert refreshed.status_code == 200 and 'data-task="r1.1"' not in refreshed.content.decode()
    assert client.get(f"/w/{team.slug}/inbox/", live_state(refreshed.content.decode()), **HTMX).status_code == 204

    moved = client.get(f"/runs/{run.pk}/", live_state(run_page) | trace_state(run_page), **HTMX).content.decode()
    assert min(seqs(moved)) == after + 1 and trace_state(moved)["after"] == str(max(seqs(moved)))
    assert client.get(f"/runs/{run.pk}/", live_state(moved) | trace_state(moved), **HTMX).status_code == 204


def test_the_run_page_shows_waiting_tasks_with_the_inbox_card(team: Team) -> None:
    run = states.question_run(team.workspace, team.users["operator"], question="Which region, then?")
    page = client_for(team, "operator").get(f"/runs/{run.pk}/").content.decode()
    assert 'data-kind="question"' in page and 'class="card item item-question"' in page
    assert "Which region, then?" in page and 'data-verb="answer"' in page


# ---- one view per verb, each with the role matrix ----

TASK_VERBS = ("approve", "deny", "answer", "retry", "abandon", "compact")
RUN_VERBS = ("cancel", "pause", "resume", "append")


def test_every_verb_has_its_own_route_and_view() -> None:
    views = {p.name: p.callback for p in console_urls.urlpatterns}
    names = [f"task_{v}" for v in TASK_VERBS] + [f"run_{v}" for v in RUN_VERBS]
    assert len({views[n] for n in names}) == len(names)


@pytest.mark.parametrize("verb", TASK_VERBS + RUN_VERBS)
def test_each_verb_holds_the_role_matrix(team: Team, verb: str) -> None:
    run = states.halted_run(team.workspace, team.users["operator"])
    name, args = (f"task_{verb}", [run.pk, "a"]) if verb in TASK_VERBS else (f"run_{verb}", [run.pk])
    url = reverse(name, args=args)
    data = {"reason": "r", "value": "v", "tasks": "[]"}
    before = list(TraceEvent.objects.filter(run=run).values_list("seq", flat=True))
    assert Client().post(url, data).status_code == 302
    assert client_for(team, "outsider").post(url, data, **HTMX).status_code == 404
    for role in ("viewer", "reader"):
        response = client_for(team, role).post(url, data, **HTMX)
        assert response.status_code == 403 and b"operator" in response.content, role
    assert list(TraceEvent.objects.filter(run=run).values_list("seq", flat=True)) == before
    assert client_for(team, "operator").get(url).status_code == 405
    acted = client_for(team, "operator").post(url, data, **HTMX)
    assert acted.status_code == 200 and b"data-outcome=" in acted.content
    assert acted["HX-Trigger"] == "oz0:changed"
