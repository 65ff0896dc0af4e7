"""The runs part of the JSON API: typed errors, receipts, the trace and the wait endpoint."""

from __future__ import annotations

import time
from typing import Any

import pytest

from runs.models import Run
from runs.usage_prices import usage_cost
from tests.conftest import Api, Team
from tests.runs.driver import drive, echo, fail


def create(team: Team, body: dict[str, Any], role: str = "operator") -> tuple[int, Any]:
    return team.api(role).post(f"/workspaces/{team.slug}/runs", body)


@pytest.mark.spec("S32")
def test_it_refuses_anonymous_callers_with_a_typed_401(team: Team) -> None:
    status, body = Api("not-a-token").post(f"/workspaces/{team.slug}/runs", {"tasks": [echo("a")]})
    assert status == 401 and body["error"]["key"] == "unauthenticated"


@pytest.mark.spec("S32")
@pytest.mark.parametrize("role,expected", [("viewer", 403), ("reader", 403), ("outsider", 404), ("operator", 201)])
def test_it_requires_write_standing_to_create(team: Team, role: str, expected: int) -> None:
    before = Run.objects.count()
    status, body = create(team, {"tasks": [echo("a")], "deliverable": "a"}, role)
    assert status == expected, body
    assert Run.objects.count() == before + (1 if expected == 201 else 0)
    if expected != 201:
        assert body["error"]["key"] in ("forbidden", "not_found")


@pytest.mark.spec("S30", "S31")
@pytest.mark.parametrize(
    "body,key",
    [
        ({"tasks": [echo("a"), echo("a")]}, "duplicate_key"),
        ({"tasks": [echo("a", after=["b"]), echo("b", after=["a"])]}, "cycle"),
        ({"tasks": [echo("a", after=["zz"])]}, "unknown_after"),
        ({"tasks": [{"key": "a", "kind": "tool", "tool": "no.such"}]}, "unknown_tool"),
        ({"tasks": [echo("a", "nul\x00")]}, "nul_byte"),
        ({"tasks": [echo("a")], "deliverable": "b"}, "unknown_deliverable"),
        ({"tasks": [echo("a")], "surprise": 1}, "unknown_field"),
        ({"tasks": [{"key": "j", "kind": "join", "mode": "quorum", "quorum": 3, "after": ["a"]}, echo("a")]}, "invalid_field"),
        ({"tasks": [echo(f"t{i}") for i in range(65)]}, "too_many_steps"),
        ({}, "missing_input"),
    ],
)
def test_it_refuses_bad_input_typed_and_writes_nothing(team: Team, body: dict[str, Any], key: str) -> None:
    before = Run.objects.count()
    status, answer = create(team, body)
    assert status == 400, answer
    assert answer["error"]["key"] == key, answer
    assert Run.objects.count() == before


@pytest.mark.spec("S31")
def test_it_refuses_exponent_numbers_and_malformed_json(team: Team) -> None:
    api = team.api()
    status, body = api.post(
        f"/workspaces/{team.slug}/runs",
        raw='{"tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": 1E5}}]}',
    )
    assert (status, body["error"]["key"]) == (400, "exponent_number")
    status, body = api.post(f"/workspaces/{team.slug}/runs", raw='{"tasks": [')
    assert status == 400 and body["error"]["key"] in ("invalid_json", "invalid_request")


@pytest.mark.spec("S30")
def test_it_refuses_a_payload_over_one_mebibyte(team: Team) -> None:
    status, body = create(team, {"tasks": [echo("a", "x" * (1024 * 1024 + 10))]})
    assert status in (400, 413) and body["error"]["key"] == "payload_too_large"


@pytest.mark.spec("S8", "S17")
def test_it_returns_receipts_with_await_tokens_on_create_and_append(team: Team) -> None:
    status, body = create(team, {"tasks": [{"key": "q", "kind": "await", "question": "?"}], "deliverable": "q"})
    assert status == 201 and set(body["receipt"]["tokens"]) == {"q"}
    run_id = body["run"]["id"]
    status, body = team.api().post(f"/runs/{run_id}/append", {"tasks": [{"key": "q2", "kind": "await", "question": "?"}]})
    assert status == 200 and set(body["receipt"]["tokens"]) == {"q2"}
    status, document = team.api().get(f"/runs/{run_id}")
    assert {t["key"]: t["status"] for t in document["tasks"]} == {"q": "dispatched", "q2": "dispatched"}


@pytest.mark.spec("S17")
def test_an_append_answers_a_receipt_and_links_not_the_run_document(team: Team) -> None:
    status, body = create(team, {"tasks": [{"key": "gate", "kind": "await", "question": "?"}], "deliverable": "gate"})
    assert status == 201 and body["receipt"]["keys"] == ["gate"]
    run_id = body["run"]["id"]
    created_seq = body["receipt"]["seq"]
    assert created_seq > 0
    status, body = team.api().post(f"/runs/{run_id}/append", {"tasks": [echo("b", 1), echo("c", 2, after=["b"])]})
    assert status == 200
    assert "tasks" not in body["run"] and body["run"]["id"] == run_id and body["run"]["status"] == "running"
    assert body["run"]["last_seq"] == body["receipt"]["seq"]
    assert body["receipt"]["keys"] == ["b", "c"] and body["receipt"]["tokens"] == {}
    seq = body["receipt"]["seq"]
    assert seq > created_seq
    assert body["links"] == {"run": f"/api/v1/runs/{run_id}", "wait": f"/api/v1/runs/{run_id}/wait?after={seq}"}
    # Every event the append wrote is at or below its seq: `wait?after=seq` misses none of what follows.
    status, trace = team.api("reader").get(f"/runs/{run_id}/trace")
    added = {e["task"]: e["seq"] for e in trace["events"] if e["event"] == "task_added"}
    assert created_seq < added["b"] < added["c"] <= seq
    status, document = team.api("reader").get(body["links"]["run"].removeprefix("/api/v1"))
    assert status == 200 and [t["key"] for t in document["tasks"]] == ["gate", "b", "c"]


@pytest.mark.spec("S15", "S22")
def test_it_serves_the_trace_oldest_first_with_errors(team: Team) -> None:
    status, body = create(team, {"tasks": [fail("a", on_failure="halt")], "deliverable": "a"})
    run = drive(Run.objects.get(pk=body["run"]["id"]))
    status, trace = team.api("reader").get(f"/runs/{run.pk}/trace")
    assert status == 200
    seqs = [e["seq"] for e in trace["events"]]
    assert seqs == sorted(seqs) and seqs[0] == 1
    failed = [e for e in trace["events"] if e["to"] == "failed"]
    assert failed and failed[0]["error"] == {"key": "tool_failed", "detail": "a failed"}
    assert set(failed[0]) >= {"seq", "at", "task", "event", "from", "to", "error", "actor"}


@pytest.mark.spec("F12")
def test_it_waits_for_events_past_a_seq(team: Team) -> None:
    status, body = create(team, {"tasks": [echo("a")], "deliverable": "a"})
    run_id = body["run"]["id"]
    last = Run.objects.get(pk=run_id).last_seq
    started = time.monotonic()
    status, waited = team.api().get(f"/runs/{run_id}/wait?after={last}&timeout=0.4")
    assert status == 200 and waited["events"] == [] and time.monotonic() - started >= 0.35
    status, waited = team.api().get(f"/runs/{run_id}/wait?after=0&timeout=5")
    assert status == 200 and waited["events"][0]["seq"] == 1 and waited["status"] == "running"


@pytest.mark.spec("S14")
def test_it_answers_a_verb_that_does_not_apply_with_409_and_changes_nothing(team: Team) -> None:
    status, body = create(team, {"tasks": [echo("a")], "deliverable": "a"})
    run = drive(Run.objects.get(pk=body["run"]["id"]))
    seq = run.last_seq
    for verb in ("retry", "abandon", "approve", "deny", "answer"):
        status, answer = team.api().post(f"/runs/{run.pk}/tasks/a/{verb}", {})
        assert status == 409, (verb, answer)
        assert answer["error"]["key"] in ("run_finished", "not_a_candidate", "not_pending")
    run.refresh_from_db()
    assert run.last_seq == seq


def test_it_hides_runs_from_non_members(team: Team) -> None:
    status, body = create(team, {"tasks": [echo("a")], "deliverable": "a"})
    status, answer = team.api("outsider").get(f"/runs/{body['run']['id']}")
    assert status == 404 and answer["error"]["key"] == "not_found"
    status, answer = team.api("outsider").get("/runs/not-a-uuid")
    assert status == 404


def test_it_lists_runs_with_keyset_paging_and_status_filters(team: Team) -> None:
    ids = [create(team, {"tasks": [echo("a")], "deliverable": "a"})[1]["run"]["id"] for _ in range(3)]
    status, page = team.api("viewer").get(f"/workspaces/{team.slug}/runs?limit=2")
    assert status == 200 and page["count"] == 3 and len(page["items"]) == 2 and page["next"]
    status, rest = team.api("viewer").get(f"/workspaces/{team.slug}/runs?limit=2&cursor={page['next']}")
    assert [i["id"] for i in page["items"] + rest["items"]] == list(reversed(ids))
    status, none = team.api("viewer").get(f"/workspaces/{team.slug}/runs?status=completed")
    assert none["count"] == 0
    status, bad = team.api("viewer").get(f"/workspaces/{team.slug}/runs?cursor=%%%")
    assert status == 400 and bad["error"]["key"] == "invalid_cursor"


def test_it_serves_an_openapi_document(team: Team) -> None:
    status, doc = team.api().get("/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert "/api/v1/workspaces/{ws}/runs" in doc["paths"]


@pytest.mark.spec("S5", "F11")
def test_the_run_documents_tasks_say_what_a_composed_call_would_do_to_those_who_may_read_it(
    team: Team, no_dispatch: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    """An approver working through the API reads the call it approves (tool and args) in the run
    document, as the console shows it; a viewer gets the tool without the arguments."""
    from tests.delegation.tree import agent, create, drive_tree

    caller = agent(
        team.workspace,
        "model: script\ntools: [test.echo]\nscript:\n  - tool_calls: [{tool: test.echo, args: {value: wire 900 to acme}}]\n"
        "  - text: done\n",
        prefix="caller",
    )
    run = drive_tree(
        create(team.workspace, team.users["operator"], agent=caller, approval={"mode": "ask"}), django_capture_on_commit_callbacks
    )
    status, document = team.api("reader").get(f"/runs/{run.pk}")
    assert status == 200
    call = next(t for t in document["tasks"] if t["key"] == "r1.1")
    assert call["status"] == "needs_approval" and call["composed"] is True and call["lineage"]
    assert call["spec"] == {"tool": "test.echo", "args": {"value": "wire 900 to acme"}}
    _, as_viewer = team.api("viewer").get(f"/runs/{run.pk}")
    viewed = next(t for t in as_viewer["tasks"] if t["key"] == "r1.1")
    assert viewed["spec"] == {"tool": "test.echo"} and viewed["composed"] is True
    assert "wire 900" not in str(as_viewer)


def test_a_plain_runs_document_asks_nothing_of_children_approvals_or_session_slots(team: Team) -> None:
    """The document asks for child runs, first approvals, model calls and a round's wait for a
    session slot only when the run has a task that can have them (a delegate, a call awaiting
    approval, a round): each is a query the read of a plain run would make for nothing."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _, created = create(team, {"tasks": [echo("a"), echo("b", after=["a"])], "deliverable": "b"})
    run_id = created["run"]["id"]
    drive(Run.objects.get(pk=run_id))
    api = team.api("operator")
    api.get(f"/runs/{run_id}")  # the caller's token and standing, read once before counting
    with CaptureQueriesContext(connection) as captured:
        status, document = api.get(f"/runs/{run_id}")
    assert status == 200 and document["status"] == "completed"
    assert document["children"] == [] and document["waiting_for_slot"] is None
    assert all("first_approval" not in task for task in document["tasks"])
    sql = [query["sql"] for query in captured.captured_queries]
    assert not [q for q in sql if '"parent_id" =' in q], "asked for child runs"
    assert not [q for q in sql if "approvals" in q or "waiting_for_slot" in q], "asked for approvals or a slot"
    assert not [q for q in sql if "provider_call" in q], "asked for model calls"
    assert document["cost"] == usage_cost([])
