"""Issue 15's console rough edges through the Django client: the inbox's live refresh keeps the
items a person loaded, a refused htmx POST answers a toast with its status, a round that ended
the job with oz.fail is failed with its kind and flags, and the inbox's keyboard hint."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from console import inbox_pages as inbox_views
from oz0agents.models import Agent, AgentVersion
from runs import kernel
from runs.models import Run, Task
from tests.conftest import Team
from tests.console import states

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def client_for(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def live_state(html: str) -> dict[str, str]:
    """The inputs of the (last) live state in a fragment: what the container sends back."""
    block = re.findall(r'<div class="live-state"[^>]*>(.*?)</div>', html)[-1]
    return dict(re.findall(r'name="([^"]+)" value="([^"]*)"', block))


def items_in(html: str) -> list[str]:
    return re.findall(r'<article class="card item[^"]*" tabindex="-1" id="([^"]+)"', html)


# ---- (a) a live refresh keeps the items a person loaded ----


@pytest.fixture
def five_approvals(team: Team, monkeypatch: pytest.MonkeyPatch) -> list[Run]:
    monkeypatch.setattr(inbox_views, "PAGE", 2)
    return [states.approval_run(team.workspace, team.users["operator"], args={"n": n}) for n in range(5)]


def test_it_keeps_the_loaded_items_when_the_inbox_refreshes_live(team: Team, five_approvals: list[Run]) -> None:
    client = client_for(team, "operator")
    url = f"/w/{team.slug}/inbox/"
    first = client.get(url, **HTMX).content.decode()
    assert len(items_in(first)) == 2 and live_state(first)["shown"] == "2"
    more_url = re.search(r'hx-get="([^"]*cursor=[^"]*)"', first).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
    assert "shown=2" in more_url

    more = client.get(more_url, **HTMX).content.decode()
    assert len(items_in(more)) == 2 and not set(items_in(more)) & set(items_in(first))
    # The answer also replaces the container's live state, out of band: four are on screen now.
    assert 'hx-swap-oob="outerHTML:#inbox-items &gt; .live-state"' in more
    state = live_state(more)
    assert state["shown"] == "4"

    # Nothing changed: the refresh at that depth is what the browser shows (204).
    assert client.get(url, {**state}, **HTMX).status_code == 204
    # Something changed: the refresh redraws all four items, not the first page.
    changed = Task.objects.get(run=five_approvals[0], key="r1.1")
    Task.objects.filter(pk=changed.pk).update(spec={**changed.spec, "args": {"n": "changed"}})
    refreshed = client.get(url, {**state}, **HTMX)
    assert refreshed.status_code == 200
    assert items_in(refreshed.content.decode()) == items_in(first) + items_in(more)
    assert live_state(refreshed.content.decode())["shown"] == "4"


@pytest.mark.parametrize("shown", ["abc", "-5", "9" * 5000, "1e9", "", "2.5", "[]", "0"])
def test_it_reads_an_odd_shown_as_the_first_page(team: Team, five_approvals: list[Run], shown: str) -> None:
    response = client_for(team, "operator").get(f"/w/{team.slug}/inbox/", {"shown": shown}, **HTMX)
    assert response.status_code == 200
    assert len(items_in(response.content.decode())) == 2


def test_it_caps_how_deep_a_refresh_goes(team: Team, five_approvals: list[Run], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox_views, "SHOWN_MAX", 3)
    for huge in ("500", "9" * 60):
        response = client_for(team, "operator").get(f"/w/{team.slug}/inbox/", {"shown": huge}, **HTMX)
        assert len(items_in(response.content.decode())) == 3


def test_it_starts_over_on_a_crafted_cursor_and_loads_more_without_javascript(team: Team, five_approvals: list[Run]) -> None:
    client = client_for(team, "operator")
    crafted = client.get(f"/w/{team.slug}/inbox/", {"cursor": "not-a-cursor!!", "shown": "2"}, **HTMX)
    assert crafted.status_code == 200 and len(items_in(crafted.content.decode())) == 2
    first = client.get(f"/w/{team.slug}/inbox/", **HTMX).content.decode()
    cursor = re.search(r"cursor=([^&\"]+)", first).group(1)  # type: ignore[union-attr]
    page = client.get(f"/w/{team.slug}/inbox/", {"cursor": cursor.replace("%3D", "=")})
    assert page.status_code == 200 and b"<html" in page.content and len(items_in(page.content.decode())) == 2
    assert b"hx-swap-oob" not in page.content


@pytest.mark.parametrize("role", ["viewer", "reader", "operator"])
def test_it_answers_every_member_and_hides_the_inbox_from_outsiders(team: Team, five_approvals: list[Run], role: str) -> None:
    url = f"/w/{team.slug}/inbox/"
    assert client_for(team, role).get(url, {"shown": "4"}, **HTMX).status_code == 200
    assert client_for(team, "outsider").get(url, {"shown": "4"}, **HTMX).status_code == 404


# ---- (b) a refused htmx POST tells its reason as a toast ----


@pytest.mark.parametrize("role", ["viewer", "reader"])
def test_it_answers_a_refused_htmx_post_with_a_toast_and_its_status(team: Team, role: str) -> None:
    run = states.approval_run(team.workspace, team.users["operator"])
    response = client_for(team, role).post(f"/runs/{run.pk}/tasks/r1.1/approve/", **HTMX)
    assert response.status_code == 403
    assert response["HX-Retarget"] == "#toasts" and response["HX-Reswap"] == "afterbegin"
    body = response.content.decode()
    assert 'data-outcome="refused"' in body and "Not allowed" in body and "operator" in body and "<html" not in body
    assert states.task(run, "r1.1").status == "needs_approval"


def test_it_answers_a_missing_task_or_a_hidden_run_with_a_404_toast(team: Team) -> None:
    run = states.approval_run(team.workspace, team.users["operator"], args={"path": "/secret-words"})
    missing = client_for(team, "operator").post(f"/runs/{run.pk}/tasks/nope/approve/", **HTMX)
    assert missing.status_code == 404 and missing["HX-Retarget"] == "#toasts"
    assert "task nope" in missing.content.decode() and "Not found" in missing.content.decode()
    hidden = client_for(team, "outsider").post(f"/runs/{run.pk}/tasks/r1.1/approve/", **HTMX)
    assert hidden.status_code == 404 and hidden["HX-Retarget"] == "#toasts"
    # An outsider learns nothing of the run: no link to it, no key, no words.
    assert str(run.pk) not in hidden.content.decode() and "secret-words" not in hidden.content.decode()
    assert "r1.1" not in hidden.content.decode()
    assert states.task(run, "r1.1").status == "needs_approval"


def test_a_form_aimed_at_the_toasts_gets_its_toast_without_a_retarget(team: Team) -> None:
    """htmx resolves a retarget from the form; the live list may have removed the form by the time
    the answer lands, and from a detached form no #toasts is found. A form that already aims at
    #toasts (htmx names it in HX-Target) is answered without one, so its answer always lands."""
    run = states.approval_run(team.workspace, team.users["operator"])
    operator = client_for(team, "operator")
    aimed = operator.post(f"/runs/{run.pk}/tasks/r1.1/approve/", HTTP_HX_TARGET="toasts", **HTMX)
    assert aimed.status_code == 200 and "HX-Retarget" not in aimed and aimed["HX-Reswap"] == "afterbegin"
    refused = client_for(team, "viewer").post(
        f"/runs/{run.pk}/tasks/r1.1/deny/", {"reason": "no"}, HTTP_HX_TARGET="toasts", **HTMX
    )
    assert refused.status_code == 403 and "HX-Retarget" not in refused and 'data-outcome="refused"' in refused.content.decode()


def test_it_keeps_the_pages_for_a_post_without_htmx(team: Team) -> None:
    run = states.approval_run(team.workspace, team.users["operator"])
    forbidden = client_for(team, "viewer").post(f"/runs/{run.pk}/tasks/r1.1/approve/")
    assert forbidden.status_code == 403 and b"<html" in forbidden.content and "HX-Retarget" not in forbidden
    missing = client_for(team, "operator").post(f"/runs/{run.pk}/tasks/nope/approve/")
    assert missing.status_code == 404 and "HX-Retarget" not in missing


def test_it_still_tells_a_lost_race_as_news(team: Team) -> None:
    run = states.approval_run(team.workspace, team.users["operator"])
    client = client_for(team, "operator")
    assert client.post(f"/runs/{run.pk}/tasks/r1.1/approve/", **HTMX).status_code == 200
    again = client.post(f"/runs/{run.pk}/tasks/r1.1/deny/", {"reason": "no"}, **HTMX)
    assert again.status_code == 200 and "Already decided" in again.content.decode()


def test_a_decision_lost_to_one_whose_run_then_finished_is_told_as_a_lost_race(team: Team) -> None:
    decided = states.approval_run(team.workspace, team.users["operator"])
    kernel.approve(run_id=decided.pk, key="r1.1", user=team.users["operator"])
    kernel.cancel_run(run_id=decided.pk, user=team.users["operator"], reason="done with it")
    client = client_for(team, "operator")
    late = client.post(f"/runs/{decided.pk}/tasks/r1.1/deny/", {"reason": "no"}, **HTMX).content.decode()
    assert "Already decided" in late and "approved" in late
    undecided = states.approval_run(team.workspace, team.users["operator"])
    kernel.cancel_run(run_id=undecided.pk, user=team.users["operator"], reason="never mind")
    closed = client.post(f"/runs/{undecided.pk}/tasks/r1.1/approve/", **HTMX).content.decode()
    assert "Already decided" not in closed and "accepts no verb" in closed
    retried = client.post(f"/runs/{decided.pk}/tasks/r1.1/retry/", **HTMX).content.decode()
    assert "Already decided" not in retried


def test_it_swaps_a_refusal_toast_from_the_page_script() -> None:
    """htmx swaps no error response by default: oz0.js must swap the toasts the server retargets."""
    from tests.conftest import ROOT

    script = (ROOT / "static" / "js" / "oz0.js").read_text()
    assert 'getResponseHeader("HX-Retarget") === "#toasts"' in script and "shouldSwap = true" in script
    assert 'target.id === "toasts"' in script  # a refusal for a form aimed at #toasts, retarget or none
    assert "htmx:responseError" in script and "htmx:sendError" in script


# ---- (c) a round that ended the job with oz.fail is failed, with its kind and flags ----


def agent_with_kinds(team: Team) -> str:
    manifest = {
        "name": "issue-reader",
        "tools": ["oz.fail"],
        "failures": [{"kind": "not_found", "description": "The issue does not exist", "person": True}],
    }
    row, _ = Agent.objects.get_or_create(name="issue-reader", workspace=team.workspace)
    AgentVersion.objects.get_or_create(
        agent=row, version=1, defaults={"manifest_text": "", "manifest": manifest, "digest": "ir-1"}
    )
    return "issue-reader"


def oz_failed_run(team: Team, kind: str = "not_found", message: str = "issue 42 is gone: secret-words") -> Run:
    body: dict[str, Any] = {
        "agent": agent_with_kinds(team),
        "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "after": [], "script": [{"text": "x"}]}],
        "deliverable": "r1",
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    claimed = kernel.claim_task(None, states.task(run, "r1").pk, "test-claim")
    assert claimed is not None
    assert kernel.round_oz_fail(claimed, kind, message, extra={}, state={})
    return Run.objects.get(pk=run.pk)


@pytest.mark.spec("F1", "F6", "F10")
def test_it_fails_the_round_that_ended_the_job_with_oz_fail(team: Team) -> None:
    run = oz_failed_run(team)
    r1 = states.task(run, "r1")
    assert run.status == "canceled" and run.failure["kind"] == "not_found"
    assert r1.status == "failed" and r1.error_key == "oz_fail" and r1.error_detail == "issue 42 is gone: secret-words"
    assert (r1.result or {}).get("oz_fail") == {"kind": "not_found"}
    # Its failure in the API is the run's: the agent's kind and flags, declared.
    status, doc = team.api("reader").get(f"/runs/{run.pk}")
    assert status == 200, doc
    failure = next(t for t in doc["tasks"] if t["key"] == "r1")["failure"]
    assert failure["kind"] == "not_found" and failure["person"] is True and failure["declared"] is True
    assert failure["message"] == "issue 42 is gone: secret-words"


@pytest.mark.spec("F6", "F11", "F12")
def test_it_shows_the_oz_fail_round_failed_on_the_run_page_in_words_for_readers_only(team: Team) -> None:
    run = oz_failed_run(team)
    row = re.compile(r'<tr data-task="r1" data-status="(\w+)">(.*?)</tr>', re.S)
    for role in ("operator", "reader", "viewer"):
        page = client_for(team, role).get(f"/runs/{run.pk}/").content.decode()
        status, cells = row.search(page).groups()  # type: ignore[union-attr]
        assert status == "failed" and "status-completed" not in cells and "status-failed" in cells
        assert ">not_found<" in cells and "badge-person" in cells and "badge-declared" in cells
        assert "oz_fail" in cells
        if role == "viewer":
            assert "secret-words" not in page
        else:
            assert "secret-words" in cells
    status, doc = team.api("viewer").get(f"/runs/{run.pk}")
    failure = next(t for t in doc["tasks"] if t["key"] == "r1")["failure"]
    assert failure["kind"] == "not_found" and failure["message"] is None


@pytest.mark.spec("F6")
def test_it_fails_the_round_undeclared_for_a_kind_the_agent_does_not_declare(team: Team) -> None:
    run = oz_failed_run(team, kind="made_up", message="?")
    status, doc = team.api("operator").get(f"/runs/{run.pk}")
    failure = next(t for t in doc["tasks"] if t["key"] == "r1")["failure"]
    assert doc["tasks"][0]["status"] == "failed" and failure["kind"] == "undeclared" and failure["declared"] is False


# ---- (d) the keyboard hint ----


def test_it_shows_the_keys_each_role_can_use(team: Team) -> None:
    states.approval_run(team.workspace, team.users["operator"])
    operator = client_for(team, "operator").get(f"/w/{team.slug}/inbox/").content.decode()
    viewer = client_for(team, "viewer").get(f"/w/{team.slug}/inbox/").content.decode()
    assert 'id="inbox-keys"' in operator and "<kbd>a</kbd> approve" in operator and "<kbd>d</kbd> deny" in operator
    assert 'id="inbox-keys"' in viewer and "<kbd>j</kbd>" in viewer and "approve" not in viewer.split('id="inbox-keys"')[1][:300]
