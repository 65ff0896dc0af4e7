"""Abandon that finishes (issue 30.4): abandoning a failure the run's deliverable needs leaves the
run held as "deliverable unresolved"; the hold card, the bulk preview and the API say so before
the click, and "abandon and cancel" ends the run in one transaction, single and bulk."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs import kernel
from runs.holds import deliverable_needs, hold_documents
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.console import states
from tests.console.bulk_holds import held

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]


def _held_with(team: Team, tasks: list[dict[str, Any]], deliverable: str) -> Run:
    """A run of these tasks (every test.fail among them failed, every first echo done), held."""
    body: dict[str, Any] = {"tasks": tasks, "deliverable": deliverable}
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    for task in tasks:
        if task.get("after"):
            continue
        claimed = kernel.claim_task(None, states.task(run, task["key"]).pk, f"claim-{task['key']}")
        assert claimed is not None
        if task["tool"] == "test.fail":
            assert kernel.task_fail(claimed, "tool_failed", "words")
        else:
            assert kernel.task_complete(claimed, {"value": 1})
    run = Run.objects.get(pk=run.pk)
    assert run.status == "needs_attention", run.status
    return run


FAIL = {"key": "f", "kind": "tool", "tool": "test.fail", "args": {"error": "tool_failed"}, "after": [], "on_failure": "halt"}
ECHO = {"kind": "tool", "tool": "test.echo", "args": {"value": 1}}


@pytest.mark.spec("S15")
def test_abandoning_what_the_deliverable_needs_leaves_the_run_held_and_says_so(team: Team) -> None:
    run = held(team.workspace, team.users["operator"])  # t0 failed, deliverable c after it
    assert hold_documents(team.users["operator"], [run])[0]["failed"][0]["strands_deliverable"] is True
    kernel.abandon(run_id=run.pk, key="t0", user=team.users["operator"])
    run = Run.objects.get(pk=run.pk)
    assert run.status == "needs_attention" and run.attention["reason"] == "deliverable_unresolved"


@pytest.mark.spec("S15")
def test_abandon_and_cancel_ends_the_run_in_one_transaction(team: Team) -> None:
    run = held(team.workspace, team.users["operator"])
    seq = run.last_seq
    kernel.abandon(run_id=run.pk, key="t0", user=team.users["operator"], cancel_run=True)
    run = Run.objects.get(pk=run.pk)
    assert run.status == "canceled" and run.attention is None
    assert Task.objects.get(run=run, key="t0").failure_resolution == "abandoned"
    assert Task.objects.get(run=run, key="c").status in ("skipped", "canceled")
    events = list(TraceEvent.objects.filter(run=run, seq__gt=seq).order_by("seq").values_list("event", "data"))
    verbs = [data.get("verb") for event, data in events if event == "verb"]
    assert verbs == ["abandon", "cancel"]
    assert next(data for event, data in events if event == "verb")["cancel_run"] is True
    # Never held again in between: no hold was recorded after the abandon.
    assert not [event for event, data in events if event == "run" and (data or {}).get("status") == "needs_attention"]


@pytest.mark.parametrize(
    ("tasks", "deliverable", "strands"),
    [
        ([FAIL, {**ECHO, "key": "c", "after": ["f"]}], "c", True),  # the deliverable comes after it
        ([FAIL], "f", True),  # it is the deliverable
        ([FAIL, {**ECHO, "key": "c", "after": ["f"]}, {**ECHO, "key": "d", "after": ["c"]}], "d", True),  # further down
        ([FAIL, {**ECHO, "key": "c", "after": ["f"]}, {**ECHO, "key": "other"}], "other", False),  # not upstream
        (
            [FAIL, {**FAIL, "key": "g"}, {"key": "j", "kind": "join", "after": ["f", "g"], "mode": "any"}],
            "j",
            False,  # a join of any source can still complete on the other (once it is retried)
        ),
    ],
    ids=["after", "itself", "transitive", "elsewhere", "any-join"],
)
def test_it_knows_which_failures_the_deliverable_cannot_do_without(
    team: Team, tasks: list[dict[str, Any]], deliverable: str, strands: bool
) -> None:
    run = _held_with(team, tasks, deliverable)
    assert ("f" in deliverable_needs([run.pk], ["f"])[run.pk]) is strands
    kernel.abandon(run_id=run.pk, key="f", user=team.users["operator"])
    after = Run.objects.get(pk=run.pk)
    # The prediction is the truth: held again exactly when it said so.
    assert (after.status == "needs_attention" and after.attention["reason"] == "deliverable_unresolved") is strands, after.status


@pytest.mark.spec("S14")
@pytest.mark.parametrize(("role", "status"), [("operator", 200), ("reader", 403), ("viewer", 403), ("outsider", 404)])
def test_bulk_abandon_and_cancel_by_role(team: Team, role: str, status: int) -> None:
    runs = [held(team.workspace, team.users["operator"], errors=("tool_failed", "tool_failed")) for _ in range(2)]
    code, body = team.api(role).post(f"/workspaces/{team.slug}/holds/abandon_and_cancel", {"runs": [str(run.pk) for run in runs]})
    assert code == status, body
    if status != 200:
        assert all(Run.objects.get(pk=run.pk).status == "needs_attention" for run in runs)
        return
    assert [r["outcome"] for r in body["results"]] == ["abandoned_and_canceled"] * 2
    assert all(r["task_keys"] == ["t0", "t1"] for r in body["results"])
    for run in runs:
        assert Run.objects.get(pk=run.pk).status == "canceled"
        assert set(Task.objects.filter(run=run, key__in=["t0", "t1"]).values_list("failure_resolution", flat=True)) == {
            "abandoned"
        }


def test_the_bulk_preview_says_which_runs_an_abandon_leaves_held(team: Team) -> None:
    stranded = held(team.workspace, team.users["operator"])
    free = _held_with(team, [FAIL, {**ECHO, "key": "other"}], "other")
    code, preview = team.api().post(f"/workspaces/{team.slug}/holds/abandon", {"all": True, "dry_run": True})
    assert code == 200, preview
    assert {item["run"]: item["strands_deliverable"] for item in preview["runs"]} == {str(stranded.pk): True, str(free.pk): False}
    client = Client()
    client.force_login(team.users["operator"])
    page = client.post(f"/w/{team.slug}/holds/bulk/preview/", {"verb": "abandon", "all": "1"}, HTTP_HX_REQUEST="true")
    assert page.status_code == 200
    assert b'data-stranded="1"' in page.content and b"stays held" in page.content
    page = client.post(f"/w/{team.slug}/holds/bulk/preview/", {"verb": "abandon_and_cancel", "all": "1"}, HTTP_HX_REQUEST="true")
    assert page.status_code == 200 and b"Abandon and cancel 2 held runs" in page.content and b"data-stranded" not in page.content


def test_the_hold_card_offers_abandon_and_cancel_only_where_an_abandon_would_strand(team: Team) -> None:
    stranded = held(team.workspace, team.users["operator"])
    free = _held_with(team, [FAIL, {**ECHO, "key": "other"}], "other")
    client = Client()
    client.force_login(team.users["operator"])
    page = client.get(f"/w/{team.slug}/holds/").content.decode()
    card = page[page.index(f'id="hold-{stranded.pk}"') :]
    card = card[: card.index("</article>")]
    assert 'data-strands-deliverable="t0"' in card and "abandon-and-cancel" in card and "Abandon only" in card
    card = page[page.index(f'id="hold-{free.pk}"') :]
    card = card[: card.index("</article>")]
    assert "data-strands-deliverable" not in card and "abandon-and-cancel" not in card
