"""Approvals with a safety net in the JSON API (issue 30, item 1): approve with edited arguments
(`POST /runs/{id}/tasks/{key}/approve` with `{"digest", "args"}`) and approve many identical
calls across runs after a preview (`POST /workspaces/{ws}/approvals/approve-many`). Both go
through the kernel verbs the console uses; every refusal is typed and changes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs import kernel
from runs.kernel import call_digest
from runs.models import Run, Task, TraceEvent
from runs.worker.round_driver import tool_message
from tests.conftest import Api, Team
from tests.factories import make_member, make_token
from tests.runs.driver import drive, task

pytestmark = pytest.mark.usefixtures("no_dispatch")


def create(team: Team, tool: str = "test.echo", args: dict[str, Any] | None = None, **body: Any) -> Run:
    """A run whose model composed one call (`r1.1`) that waits for a person's approval."""
    script = [{"tool_calls": [{"tool": tool, "args": args if args is not None else {"value": 1}}]}, {"text": "done"}]
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=body.pop("user", team.users["operator"]),
        body={
            "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script}],
            "deliverable": "r1",
            "approval": body.pop("approval", {"mode": "ask"}),
            **body,
        },
    )
    run = drive(run)
    assert task(run, "r1.1").status == "needs_approval"
    return run


def approve_path(run: Run, key: str = "r1.1") -> str:
    return f"/runs/{run.pk}/tasks/{key}/approve"


def unchanged(run: Run, args: dict[str, Any], key: str = "r1.1") -> bool:
    call = task(run, key)
    no_verb = not TraceEvent.objects.filter(run=run, task_key=key, event="verb").exists()
    return call.status == "needs_approval" and call.spec["args"] == args and call.approved_digest is None and no_verb


# ---- approve with edited arguments ----


@pytest.mark.spec("S5", "S6", "S14")
def test_an_approval_with_edited_args_runs_the_edited_call_bound_to_its_own_digest(team: Team) -> None:
    run = create(team, args={"value": "rm -rf /"})
    before = call_digest("test.echo", {"value": "rm -rf /"})
    status, body = team.api().post(approve_path(run), {"digest": before, "args": {"value": "ls"}})
    assert status == 200, body
    edited = call_digest("test.echo", {"value": "ls"})
    call = task(run, "r1.1")
    assert call.approved_digest == edited and call.spec["args"] == {"value": "ls"}
    [verb] = TraceEvent.objects.filter(run=run, task_key="r1.1", event="verb")
    assert (verb.data or {})["original_digest"] == before and (verb.data or {})["digest"] == edited
    run = drive(run)
    assert run.status == "completed" and (task(run, "r1.1").result or {})["value"] == "ls"
    # The model is told the arguments were edited, and by whom.
    editor = team.users["operator"].username
    assert tool_message(task(run, "r1.1"))["edited"]["by"] == editor


@pytest.mark.spec("F11", "F12")
def test_the_audit_api_shows_both_calls_to_readers_and_that_it_was_edited_to_viewers(team: Team) -> None:
    run = create(team, args={"value": "first"})
    assert (
        team.api().post(approve_path(run), {"digest": call_digest("test.echo", {"value": "first"}), "args": {"value": "second"}})[
            0
        ]
        == 200
    )
    for role, words in (("reader", True), ("viewer", False)):
        status, page = team.api(role).get(f"/workspaces/{team.slug}/audit?run={run.pk}")
        assert status == 200, page
        [entry] = [e for e in page["items"] if e["verb"] == "approve"]
        assert entry["edited"] is True and entry["actor"] == team.users["operator"].username
        if words:
            assert (entry["original_args"], entry["args"]) == ({"value": "first"}, {"value": "second"})
        else:
            assert entry["original_args"] is None and entry["args"] is None
        status, trace = team.api(role).get(f"/runs/{run.pk}/trace")
        [event] = [e for e in trace["events"] if e["event"] == "verb"]
        assert ("first" in json.dumps(event)) is words


def test_unchanged_args_are_a_plain_approval_and_no_args_as_before(team: Team) -> None:
    run = create(team)
    digest = call_digest("test.echo", {"value": 1})
    assert team.api().post(approve_path(run), {"digest": digest, "args": {"value": 1}})[0] == 200
    [verb] = TraceEvent.objects.filter(run=run, task_key="r1.1", event="verb")
    assert verb.data == {"verb": "approve", "digest": digest}
    other = create(team)
    assert team.api().post(approve_path(other), {"digest": digest, "args": None})[0] == 200
    assert task(other, "r1.1").approved_digest == digest


@pytest.mark.spec("S32", "F11")
def test_the_role_matrix_of_an_edited_approval(team: Team) -> None:
    run = create(team)
    body = {"digest": call_digest("test.echo", {"value": 1}), "args": {"value": 2}}
    assert team.api("outsider").post(approve_path(run), body)[0] == 404
    for role in ("viewer", "reader"):
        status, answer = team.api(role).post(approve_path(run), body)
        assert (status, answer["error"]["key"]) == (403, "forbidden")
    # Someone else's private run: another operator may not edit what they may not read.
    private = create(team, private=True)
    other = Api(make_token(user=make_member(workspace=team.workspace, role="operator")))
    status, answer = other.post(approve_path(private), body)
    assert (status, answer["error"]["key"]) == (403, "content_hidden")
    assert unchanged(run, {"value": 1}) and unchanged(private, {"value": 1})
    assert team.api().post(approve_path(run), body)[0] == 200


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


OMIT = object()
BAD_EDITS = [
    ("args a list", {"args": [1, 2]}, 400, "invalid_field"),
    ("args a text", {"args": "value"}, 400, "invalid_field"),
    ("args without a digest", {"digest": OMIT, "args": {"value": 2}}, 400, "invalid_request"),
    ("args with a null digest", {"digest": None, "args": {"value": 2}}, 400, "invalid_request"),
    ("a malformed digest", {"digest": "XYZ", "args": {"value": 2}}, 400, "invalid_field"),
    ("a wrong digest", {"digest": call_digest("test.echo", {"value": 9}), "args": {"value": 2}}, 409, "approval_stale"),
    ("a NUL byte", {"args": {"value": "a\u0000b"}}, 400, None),
    ("an exponent number", {"args": {"value": 1e300}}, 400, None),
    ("too deep", {"args": nested(kernel.MAX_DEPTH + 5)}, 400, None),
    ("huge", {"args": {"value": "x" * kernel.MAX_PAYLOAD_BYTES}}, 413, "payload_too_large"),
]


@pytest.mark.spec("S30", "S31")
@pytest.mark.parametrize(("name", "body", "status", "key"), BAD_EDITS, ids=[b[0] for b in BAD_EDITS])
def test_bad_edits_are_typed_refusals_that_change_nothing(
    team: Team, name: str, body: dict[str, Any], status: int, key: str | None
) -> None:
    run = create(team)
    body = {k: v for k, v in {"digest": call_digest("test.echo", {"value": 1}), **body}.items() if v is not OMIT}
    got, answer = team.api().post(approve_path(run), body)
    assert got == status, answer
    assert isinstance(answer["error"]["key"], str) and (key is None or answer["error"]["key"] == key), answer
    assert unchanged(run, {"value": 1})


@pytest.mark.spec("S5")
def test_an_edit_a_rule_denies_is_refused(team: Team) -> None:
    rules = [{"tool": "test.echo", "decision": "deny", "when": {"args.value": {"prefix": "/etc"}}}]
    run = create(team, args={"value": "/tmp/x"}, approval={"mode": "rules", "rules": rules})
    body = {"digest": call_digest("test.echo", {"value": "/tmp/x"}), "args": {"value": "/etc/passwd"}}
    status, answer = team.api().post(approve_path(run), body)
    assert (status, answer["error"]["key"]) == (409, "edit_denied_by_rule")
    assert unchanged(run, {"value": "/tmp/x"})


@pytest.mark.spec("S10")
def test_an_edit_cannot_make_a_call_with_effects_replayable(team: Team) -> None:
    run = create(team, tool="test.remote", args={"id": "e1"})
    body = {"digest": call_digest("test.remote", {"id": "e1"}), "args": {"id": "e1", "replayable": True}}
    status, answer = team.api().post(approve_path(run), body)
    assert (status, answer["error"]["key"]) == (409, "edit_changes_replayability")
    assert unchanged(run, {"id": "e1"})


def test_the_document_shows_the_approval_body_with_its_args() -> None:
    from ninja import NinjaAPI

    from oz0site.api import api

    paths = NinjaAPI.get_openapi_schema(api, path_prefix="/api/v1/")["paths"]
    approve = paths["/api/v1/runs/{run_id}/tasks/{key}/approve"]["post"]["requestBody"]["content"]["application/json"]
    assert approve["schema"] == kernel.body_schema(kernel.APPROVE_BODY)
    assert "args" in approve["schema"]["anyOf"][0]["properties"]
    many = paths["/api/v1/workspaces/{ws}/approvals/approve-many"]["post"]["requestBody"]
    from inbox.approvals_api import APPROVE_MANY_BODY

    assert many["required"] and many["content"]["application/json"]["schema"] == kernel.body_schema(APPROVE_MANY_BODY)


# ---- approve many ----


def many_path(team: Team) -> str:
    return f"/workspaces/{team.slug}/approvals/approve-many"


def refs(calls: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(c["run"], c["task"]) for c in calls}


def pending(run: Run) -> bool:
    return task(run, "r1.1").status == "needs_approval"


@pytest.mark.spec("S5", "S6", "F11")
def test_a_preview_lists_the_identical_calls_the_caller_may_approve_and_decides_nothing(team: Team) -> None:
    same = [create(team, args={"value": "same"}) for _ in range(3)]
    different = create(team, args={"value": "other"})
    # Someone else's private run with the same call: never listed to another operator, nor its digest confirmed.
    colleague = make_member(workspace=team.workspace, role="operator")
    theirs = create(team, args={"value": "same"}, private=True, user=colleague)
    digest = call_digest("test.echo", {"value": "same"})
    status, body = team.api().post(many_path(team), {"tool": "test.echo", "digest": digest, "preview": True})
    assert status == 200, body
    assert body["preview"] is True and body["replayable"] is True and body["count"] == 3
    assert refs(body["would_decide"]) == {(str(r.pk), "r1.1") for r in same}
    assert body["decided"] is None and body["skipped"] == [] and body["more"] is False
    assert all(c["deadline"] for c in body["would_decide"])
    assert all(pending(r) for r in [*same, different, theirs])
    # The colleague sees their own private call too.
    status, mine = Api(make_token(user=colleague)).post(many_path(team), {"tool": "test.echo", "digest": digest, "preview": True})
    assert (str(theirs.pk), "r1.1") in refs(mine["would_decide"]) and mine["count"] == 4


@pytest.mark.spec("S5", "S6")
def test_approve_many_decides_each_through_the_kernel_and_lists_what_it_did(team: Team) -> None:
    same = [create(team, args={"value": "same"}) for _ in range(3)]
    different = create(team, args={"value": "other"})
    digest = call_digest("test.echo", {"value": "same"})
    status, body = team.api().post(many_path(team), {"tool": "test.echo", "digest": digest})
    assert status == 200, body
    assert body["preview"] is False and body["count"] == 3 and body["skipped"] == []
    assert refs(body["decided"]) == {(str(r.pk), "r1.1") for r in same}
    for run in same:
        assert task(run, "r1.1").approved_digest == digest
        [verb] = TraceEvent.objects.filter(run=run, task_key="r1.1", event="verb")
        assert verb.actor == team.users["operator"].username and verb.data == {"verb": "approve", "digest": digest}
    assert pending(different)
    # Nothing left: an empty answer, not an error.
    status, again = team.api().post(many_path(team), {"tool": "test.echo", "digest": digest})
    assert status == 200 and again["decided"] == [] and again["count"] == 0


@pytest.mark.spec("S6")
def test_the_chosen_calls_only_and_a_call_decided_meanwhile_is_skipped_with_its_reason(team: Team) -> None:
    same = [create(team, args={"value": "same"}) for _ in range(3)]
    digest = call_digest("test.echo", {"value": "same"})
    kernel.deny(run_id=same[1].pk, key="r1.1", user=team.users["operator"], reason="no")
    chosen = [{"run": str(r.pk), "task": "r1.1"} for r in same[:2]]
    status, preview = team.api().post(many_path(team), {"tool": "test.echo", "digest": digest, "preview": True, "calls": chosen})
    assert status == 200 and refs(preview["would_decide"]) == {(str(same[0].pk), "r1.1")}
    assert [(s["run"], s["reason"]) for s in preview["skipped"]] == [(str(same[1].pk), "not_matching")]
    status, body = team.api().post(many_path(team), {"tool": "test.echo", "digest": digest, "calls": chosen})
    assert status == 200, body
    assert refs(body["decided"]) == {(str(same[0].pk), "r1.1")}
    assert [(s["run"], s["reason"]) for s in body["skipped"]] == [(str(same[1].pk), "not_pending")]
    assert pending(same[2])  # not chosen: left alone


def test_a_call_of_another_digest_or_workspace_named_in_calls_is_skipped_never_approved(team: Team) -> None:
    other_call = create(team, args={"value": "other"})
    elsewhere = Team()
    foreign = create(elsewhere, args={"value": "same"})
    from tenancy.models import Membership

    Membership.objects.create(workspace=elsewhere.workspace, user=team.users["operator"], role="operator")
    digest = call_digest("test.echo", {"value": "same"})
    calls = [{"run": str(other_call.pk), "task": "r1.1"}, {"run": str(foreign.pk), "task": "r1.1"}]
    status, body = team.api().post(many_path(team), {"tool": "test.echo", "digest": digest, "calls": calls})
    assert status == 200 and body["decided"] == []
    assert {(s["run"], s["reason"]) for s in body["skipped"]} == {
        (str(other_call.pk), "approval_stale"),
        (str(foreign.pk), "not_found"),
    }
    assert pending(other_call) and pending(foreign)


@pytest.mark.spec("S10")
def test_approving_many_calls_with_effects_needs_confirm_effects(team: Team) -> None:
    runs = [create(team, tool="test.effect", args={"id": "same"}) for _ in range(2)]
    digest = call_digest("test.effect", {"id": "same"})
    status, preview = team.api().post(many_path(team), {"tool": "test.effect", "digest": digest, "preview": True})
    assert status == 200 and preview["replayable"] is False and preview["count"] == 2
    status, refused = team.api().post(many_path(team), {"tool": "test.effect", "digest": digest})
    assert refused["decided"] == [] and {s["reason"] for s in refused["skipped"]} == {"effects_unconfirmed"}
    assert all(pending(r) for r in runs)
    status, confirmed = team.api().post(many_path(team), {"tool": "test.effect", "digest": digest, "confirm_effects": True})
    assert confirmed["count"] == 2 and not any(pending(r) for r in runs)


@pytest.mark.spec("S32", "F11")
def test_the_role_matrix_of_approve_many(team: Team) -> None:
    run = create(team)
    body = {"tool": "test.echo", "digest": call_digest("test.echo", {"value": 1})}
    for preview in (True, False):
        assert team.api("outsider").post(many_path(team), {**body, "preview": preview})[0] == 404
        for role in ("viewer", "reader"):
            status, answer = team.api(role).post(many_path(team), {**body, "preview": preview})
            assert (status, answer["error"]["key"]) == (403, "forbidden")
    # Another operator and someone else's private run: never listed, never decided blind.
    private = create(team, private=True)
    other = Api(make_token(user=make_member(workspace=team.workspace, role="operator")))
    status, answer = other.post(many_path(team), {**body, "calls": [{"run": str(private.pk), "task": "r1.1"}]})
    assert status == 200 and answer["decided"] == [] and answer["skipped"][0]["reason"] == "content_hidden"
    status, answer = other.post(many_path(team), body)
    assert refs(answer["decided"]) == {(str(run.pk), "r1.1")}
    assert pending(private)


NIL = "00000000-0000-0000-0000-000000000000"
BAD_MANY = [
    ("no body", None, 400),
    ("a list", [1], 400),
    ("no tool", {"digest": "a" * 64}, 400),
    ("no digest", {"tool": "test.echo"}, 400),
    ("a malformed digest", {"tool": "test.echo", "digest": "A" * 64}, 400),
    ("an empty tool", {"tool": "", "digest": "a" * 64}, 400),
    ("a long tool", {"tool": "t" * 201, "digest": "a" * 64}, 400),
    ("preview not a boolean", {"tool": "test.echo", "digest": "a" * 64, "preview": "yes"}, 400),
    ("calls empty", {"tool": "test.echo", "digest": "a" * 64, "calls": []}, 400),
    ("a call not an object", {"tool": "test.echo", "digest": "a" * 64, "calls": ["x"]}, 400),
    ("a call without a task", {"tool": "test.echo", "digest": "a" * 64, "calls": [{"run": NIL}]}, 400),
    ("a call with a bad run", {"tool": "test.echo", "digest": "a" * 64, "calls": [{"run": "nope", "task": "r"}]}, 400),
    ("a call with extra fields", {"tool": "test.echo", "digest": "a" * 64, "calls": [{"run": NIL, "task": "r", "x": {}}]}, 400),
    ("a call nested deep", {"tool": "test.echo", "digest": "a" * 64, "calls": [{"run": NIL, "task": nested(50)}]}, 400),
    (
        "too many calls",
        {"tool": "test.echo", "digest": "a" * 64, "calls": [{"run": NIL, "task": f"r{i}"} for i in range(101)]},
        400,
    ),
    ("huge", {"tool": "test.echo", "digest": "a" * 64, "pad": "x" * 70_000}, 413),
]


@pytest.mark.parametrize(("name", "body", "status"), BAD_MANY, ids=[b[0] for b in BAD_MANY])
def test_bad_approve_many_input_is_a_typed_refusal_that_changes_nothing(team: Team, name: str, body: Any, status: int) -> None:
    run = create(team)
    raw = "" if body is None else json.dumps(body)
    got, answer = team.api().call("POST", many_path(team), raw=raw) if raw else team.api().call("POST", many_path(team))
    assert got == status, answer
    assert isinstance(answer, dict) and isinstance(answer["error"]["key"], str), answer
    assert unchanged(run, {"value": 1})
    assert Task.objects.filter(run=run, approved_digest__isnull=False).count() == 0
