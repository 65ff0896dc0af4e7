"""Approver groups (issue 31 item 4): a call whose tool matches a group's patterns is decided by
that group's members only, in the kernel, whichever surface asks (API, console, approve many); with
`two_approvers` a call with effects runs once two different members approved it. The groups' API:
members read, operators write, bad bodies are typed 4xx that change nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs import kernel
from runs.kernel import KernelError
from runs.models import Run, Task, TraceEvent
from tenancy.models import ApproverGroup, Workspace
from tests.conftest import Api, Team
from tests.console import states
from tests.factories import make_member, make_token

pytestmark = pytest.mark.django_db


def group(workspace: Workspace, name: str, tools: list[str], *members: Any, two: bool = False) -> ApproverGroup:
    row = ApproverGroup.objects.create(workspace=workspace, name=name, tools=tools, two_approvers=two)
    row.members.set(members)
    return row


def pending(team: Team, tool: str = "test.effect", args: Any = None) -> Run:
    return states.approval_run(team.workspace, team.users["operator"], tool=tool, args=args or {"amount": 5})


def status_of(run: Run, key: str = "r1.1") -> str:
    return Task.objects.get(run=run, key=key).status


def verbs(run: Run, key: str = "r1.1") -> list[dict[str, Any]]:
    return [e.data for e in TraceEvent.objects.filter(run=run, task_key=key, event="verb").order_by("seq")]


@pytest.fixture
def finance(team: Team) -> Any:
    """An operator in the finance group (which owns `test.effect*`, the calls with effects); the team's operator is not in it."""
    member = make_member(workspace=team.workspace, role="operator")
    group(team.workspace, "finance", ["test.effect*"], member)
    return member


# ---- the kernel's rule ----


@pytest.mark.spec("S5", "S6")
def test_a_group_member_approves_a_call_of_its_tools(team: Team, finance: Any) -> None:
    run = pending(team)
    kernel.approve(run_id=run.pk, key="r1.1", user=finance)
    assert status_of(run) != "needs_approval"
    assert [v["verb"] for v in verbs(run)] == ["assign", "approve"]


@pytest.mark.spec("S5")
def test_a_parked_call_is_assigned_to_its_groups_in_the_audit_trail(team: Team, finance: Any) -> None:
    run = pending(team)
    [assign] = TraceEvent.objects.filter(run=run, task_key="r1.1", event="verb", data__verb="assign")
    assert assign.actor == "oz0" and assign.data == {"verb": "assign", "groups": ["finance"], "two_approvers": False}
    other = pending(team, tool="test.echo")
    assert not TraceEvent.objects.filter(run=other, event="verb").exists()  # the operators' own: no entry


@pytest.mark.spec("S6")
@pytest.mark.parametrize("verb", ["approve", "deny", "approve_edited"])
def test_an_operator_outside_the_group_is_refused_typed_and_nothing_changes(team: Team, finance: Any, verb: str) -> None:
    run = pending(team)
    before = list(TraceEvent.objects.filter(run=run).values_list("seq", flat=True))
    call = {
        "approve": lambda: kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"]),
        "deny": lambda: kernel.deny(run_id=run.pk, key="r1.1", user=team.users["operator"], reason="no"),
        "approve_edited": lambda: kernel.approve_edited(
            run_id=run.pk,
            key="r1.1",
            user=team.users["operator"],
            digest=kernel.spec_digest(Task.objects.get(run=run, key="r1.1").spec),
            args={"amount": 1},
        ),
    }[verb]
    with pytest.raises(KernelError) as refused:
        call()
    assert (refused.value.key, refused.value.status, refused.value.extra) == ("not_an_approver", 403, {"groups": ["finance"]})
    assert status_of(run) == "needs_approval"
    assert list(TraceEvent.objects.filter(run=run).values_list("seq", flat=True)) == before


@pytest.mark.spec("S6")
def test_the_api_answers_not_an_approver_and_a_member_gets_through(team: Team, finance: Any) -> None:
    run = pending(team)
    status, body = team.api("operator").post(f"/runs/{run.pk}/tasks/r1.1/approve", {})
    assert (status, body["error"]["key"], body["error"]["groups"]) == (403, "not_an_approver", ["finance"])
    status, body = Api(make_token(user=finance)).post(f"/runs/{run.pk}/tasks/r1.1/approve", {})
    assert status == 200, body


def test_a_call_no_group_matches_is_any_operators_and_any_matching_group_may_decide(team: Team, finance: Any) -> None:
    free = pending(team, tool="test.echo")
    kernel.approve(run_id=free.pk, key="r1.1", user=team.users["operator"])
    assert status_of(free) != "needs_approval"
    auditor = make_member(workspace=team.workspace, role="operator")
    group(team.workspace, "audit", ["test.effect_rep*"], auditor)
    refund = pending(team, tool="test.effect_replayable")
    kernel.approve(run_id=refund.pk, key="r1.1", user=auditor)  # audit's, and finance's too
    assert status_of(refund) != "needs_approval"
    charge = pending(team, tool="test.effect")
    with pytest.raises(KernelError, match="not_an_approver"):
        kernel.approve(run_id=charge.pk, key="r1.1", user=auditor)


def test_a_group_member_still_needs_the_operator_role(team: Team) -> None:
    group(team.workspace, "finance", ["test.effect*"], team.users["reader"])
    run = pending(team)
    with pytest.raises(KernelError) as refused:
        kernel.approve(run_id=run.pk, key="r1.1", user=team.users["reader"])
    assert refused.value.key == "forbidden"


def test_a_group_deleted_gives_its_calls_back_to_the_operators(team: Team, finance: Any) -> None:
    run = pending(team)
    ApproverGroup.objects.filter(workspace=team.workspace).delete()
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"])
    assert status_of(run) != "needs_approval"


# ---- two approvers ----


@pytest.fixture
def pair(team: Team) -> tuple[Any, Any]:
    first, second = (make_member(workspace=team.workspace, role="operator") for _ in range(2))
    group(team.workspace, "finance", ["test.effect", "payments.*"], first, second, two=True)
    return first, second


@pytest.mark.spec("S5", "S6")
def test_a_call_with_effects_runs_once_two_different_members_approved_it(team: Team, pair: tuple[Any, Any]) -> None:
    first, second = pair
    run = pending(team)
    kernel.approve(run_id=run.pk, key="r1.1", user=first)
    call = Task.objects.get(run=run, key="r1.1")
    assert call.status == "needs_approval" and call.approved_digest is None
    assert [a["by"] for a in call.state["approvals"]] == [first.username]
    with pytest.raises(KernelError) as twice:
        kernel.approve(run_id=run.pk, key="r1.1", user=first)
    assert (twice.value.key, twice.value.status) == ("same_approver", 409)
    kernel.approve(run_id=run.pk, key="r1.1", user=second)
    assert status_of(run) != "needs_approval"
    approvals = [v for v in verbs(run) if v["verb"] == "approve"]
    assert [(v["approval"], v["of"]) for v in approvals] == [(1, 2), (2, 2)]
    assert approvals[1]["first_by"] == first.username
    entries = {e["note"] for e in team.api("operator").get(f"/workspaces/{team.slug}/audit?verb=approve")[1]["items"]}
    assert "first of two approvals: the call waits for a second approver" in entries
    assert f"second of two approvals (the first by {first.username})" in entries


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_the_run_document_shows_who_gave_the_first_approval_and_when(team: Team, pair: tuple[Any, Any], role: str) -> None:
    first, second = pair
    run = pending(team)

    def call() -> dict[str, Any]:
        status, doc = team.api(role).get(f"/runs/{run.pk}")
        assert status == 200, doc
        return next(t for t in doc["tasks"] if t["key"] == "r1.1")

    assert "first_approval" not in call()
    kernel.approve(run_id=run.pk, key="r1.1", user=first)
    given = Task.objects.get(run=run, key="r1.1").state["approvals"][0]
    assert call()["first_approval"] == {"by": first.username, "at": given["at"]}
    kernel.approve(run_id=run.pk, key="r1.1", user=second)
    assert "first_approval" not in call()  # approved twice: it waits for no one


def test_the_openapi_document_shows_the_first_approval_of_a_task(team: Team) -> None:
    schemas = team.api("viewer").get("/openapi.json")[1]["components"]["schemas"]
    task = schemas["TaskDocument"]["properties"]["first_approval"]
    first = schemas[task["$ref"].rsplit("/", 1)[-1]] if "$ref" in task else task
    assert set(first["properties"]) == {"by", "at"} and set(first["required"]) == {"by", "at"}


def test_a_replayable_call_needs_one_approver_even_in_a_two_approver_group(team: Team, pair: tuple[Any, Any]) -> None:
    group(team.workspace, "echoes", ["test.echo"], pair[0], two=True)
    run = pending(team, tool="test.echo")
    kernel.approve(run_id=run.pk, key="r1.1", user=pair[0])
    assert status_of(run) != "needs_approval"


@pytest.mark.spec("S6")
@pytest.mark.parametrize("denier", [0, 1])
def test_a_denial_by_either_approver_ends_it(team: Team, pair: tuple[Any, Any], denier: int) -> None:
    run = pending(team)
    kernel.approve(run_id=run.pk, key="r1.1", user=pair[0])
    kernel.deny(run_id=run.pk, key="r1.1", user=pair[denier], reason="not this one")
    call = Task.objects.get(run=run, key="r1.1")
    assert (call.status, call.error_key) == ("failed", "approval_denied")


def test_an_edit_is_a_new_call_whose_first_approval_is_the_editors(team: Team, pair: tuple[Any, Any]) -> None:
    first, second = pair
    run = pending(team)
    kernel.approve(run_id=run.pk, key="r1.1", user=first)
    digest = kernel.spec_digest(Task.objects.get(run=run, key="r1.1").spec)
    kernel.approve_edited(run_id=run.pk, key="r1.1", user=second, digest=digest, args={"amount": 1})
    call = Task.objects.get(run=run, key="r1.1")
    assert call.status == "needs_approval" and call.spec["args"] == {"amount": 1}
    assert [a["by"] for a in call.state["approvals"]] == [second.username]
    document = team.api("operator").get(f"/runs/{run.pk}")[1]
    assert next(t for t in document["tasks"] if t["key"] == "r1.1")["first_approval"]["by"] == second.username
    with pytest.raises(KernelError, match="same_approver"):
        kernel.approve(run_id=run.pk, key="r1.1", user=second)
    kernel.approve(run_id=run.pk, key="r1.1", user=first, digest=kernel.spec_digest(call.spec))
    assert status_of(run) != "needs_approval"


def test_approve_many_records_first_approvals_and_skips_what_is_not_yours(team: Team, pair: tuple[Any, Any]) -> None:
    first, _ = pair
    runs = [pending(team) for _ in range(2)]
    digest = kernel.spec_digest(Task.objects.get(run=runs[0], key="r1.1").spec)
    body = {"tool": "test.effect", "digest": digest, "confirm_effects": True}
    status, outsider = team.api("operator").post(f"/workspaces/{team.slug}/approvals/approve-many", body)
    assert status == 200 and outsider["count"] == 0 and not outsider["decided"]
    status, answer = Api(make_token(user=first)).post(f"/workspaces/{team.slug}/approvals/approve-many", body)
    assert status == 200, answer
    assert answer["decided"] == [] and {s["reason"] for s in answer["skipped"]} == {"first_approval"}
    assert all(status_of(run) == "needs_approval" for run in runs)


# ---- the API: who reads and writes ----

BODY = {"name": "finance", "tools": ["payments.*"], "members": []}


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 200), ("reader", 200), ("operator", 200)])
def test_every_member_lists_the_groups_and_an_outsider_finds_no_workspace(team: Team, role: str, expected: int) -> None:
    group(team.workspace, "finance", ["payments.*"], team.users["operator"], two=True)
    status, body = team.api(role).get(f"/workspaces/{team.slug}/approver-groups")
    assert status == expected
    if status == 200:
        [item] = body["items"]
        assert (item["name"], item["tools"], item["members"], item["two_approvers"], item["escalate_to"]) == (
            "finance",
            ["payments.*"],
            [team.users["operator"].username],
            True,
            None,
        )


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 201)])
def test_only_an_operator_makes_a_group(team: Team, role: str, expected: int) -> None:
    status, body = team.api(role).post(f"/workspaces/{team.slug}/approver-groups", BODY)
    assert status == expected, body
    assert ApproverGroup.objects.filter(workspace=team.workspace).exists() is (expected == 201)


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 200)])
def test_only_an_operator_replaces_a_group(team: Team, role: str, expected: int) -> None:
    row = group(team.workspace, "finance", ["payments.*"])
    wanted = {"name": "money", "tools": ["refunds.?"], "members": [team.users["operator"].username], "two_approvers": True}
    status, body = team.api(role).call("PUT", f"/workspaces/{team.slug}/approver-groups/{row.pk}", wanted)
    assert status == expected, body
    row.refresh_from_db()
    changed = (row.name, row.tools, row.two_approvers, [m.username for m in row.members.all()])
    assert changed == (
        ("money", ["refunds.?"], True, [team.users["operator"].username])
        if expected == 200
        else ("finance", ["payments.*"], False, [])
    )


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 204)])
def test_only_an_operator_deletes_a_group(team: Team, role: str, expected: int) -> None:
    row = group(team.workspace, "finance", ["payments.*"])
    status, _ = team.api(role).call("DELETE", f"/workspaces/{team.slug}/approver-groups/{row.pk}")
    assert status == expected
    assert ApproverGroup.objects.filter(pk=row.pk).exists() is (expected != 204)


def test_a_group_of_another_workspace_is_not_found(team: Team) -> None:
    other = Team()
    row = group(other.workspace, "finance", ["payments.*"])
    status, body = team.api("operator").call("PUT", f"/workspaces/{team.slug}/approver-groups/{row.pk}", BODY)
    assert (status, body["error"]["key"]) == (404, "not_found")
    assert team.api("operator").call("DELETE", f"/workspaces/{team.slug}/approver-groups/{row.pk}")[0] == 404
    assert ApproverGroup.objects.filter(pk=row.pk).exists()


def test_a_taken_name_is_a_conflict_and_escalation_names_a_group(team: Team) -> None:
    api = team.api("operator")
    assert api.post(f"/workspaces/{team.slug}/approver-groups", BODY)[0] == 201
    status, body = api.post(f"/workspaces/{team.slug}/approver-groups", BODY)
    assert (status, body["error"]["key"]) == (409, "group_exists")
    leads = {"name": "leads", "tools": ["*"], "members": [], "escalate_to": "finance"}
    status, body = api.post(f"/workspaces/{team.slug}/approver-groups", leads)
    assert status == 201 and body["escalate_to"] == "finance"


HUGE = {"name": "finance", "tools": ["x" * 1000] * 1500, "members": []}


@pytest.mark.parametrize(
    "body,status,key",
    [
        ({"tools": ["payments.*"], "members": []}, 400, "invalid_name"),
        ({**BODY, "name": "Finance"}, 400, "invalid_name"),
        ({**BODY, "name": "operators"}, 400, "invalid_name"),
        ({**BODY, "name": {"nested": {"deeper": ["finance"]}}}, 400, "invalid_name"),
        ({**BODY, "tools": []}, 400, "invalid_tools"),
        ({**BODY, "tools": "payments.*"}, 400, "invalid_tools"),
        ({**BODY, "tools": [["payments.*"]]}, 400, "invalid_tool_pattern"),
        ({**BODY, "tools": [{"glob": "payments.*"}]}, 400, "invalid_tool_pattern"),
        ({**BODY, "tools": ["payments.[a-z]*"]}, 400, "invalid_tool_pattern"),
        ({**BODY, "tools": ["pay ments"]}, 400, "invalid_tool_pattern"),
        ({**BODY, "tools": [""]}, 400, "invalid_tool_pattern"),
        ({**BODY, "tools": ["p" * 201]}, 400, "invalid_tool_pattern"),
        ({**BODY, "tools": [f"t{i}.*" for i in range(51)]}, 400, "invalid_tools"),
        ({**BODY, "members": "alice"}, 400, "invalid_members"),
        ({**BODY, "members": ["nobody-here"]}, 400, "not_a_member"),
        ({**BODY, "two_approvers": "yes"}, 400, "invalid_field"),
        ({**BODY, "escalate_to": "nobody"}, 400, "invalid_escalate_to"),
        ({**BODY, "escalate_to": "finance"}, 400, "invalid_escalate_to"),
        ({**BODY, "escalate_to": ["finance"]}, 400, "invalid_escalate_to"),
        ({**BODY, "colour": "blue"}, 400, "unknown_field"),
        (["finance"], 400, "invalid_request"),
        (HUGE, 413, None),
    ],
)
def test_a_bad_body_is_a_typed_refusal_that_changes_nothing(team: Team, body: Any, status: int, key: str | None) -> None:
    row = group(team.workspace, "keep", ["keep.*"])
    for method, path in (
        ("POST", f"/workspaces/{team.slug}/approver-groups"),
        ("PUT", f"/workspaces/{team.slug}/approver-groups/{row.pk}"),
    ):
        got, answer = team.api("operator").call(method, path, body)
        assert got == status, (method, answer)
        if key is not None:
            assert answer["error"]["key"] == key, (method, answer)
    assert list(ApproverGroup.objects.filter(workspace=team.workspace).values_list("name", "tools")) == [("keep", ["keep.*"])]


@pytest.mark.parametrize("member", ["reader", "viewer"])
def test_a_member_who_may_not_decide_is_refused_as_not_an_operator(team: Team, member: str) -> None:
    row = group(team.workspace, "keep", ["keep.*"], team.users["operator"])
    body = {**BODY, "members": [team.users["operator"].username, team.users[member].username]}
    for method, path in (
        ("POST", f"/workspaces/{team.slug}/approver-groups"),
        ("PUT", f"/workspaces/{team.slug}/approver-groups/{row.pk}"),
    ):
        got, answer = team.api("operator").call(method, path, body)
        assert (got, answer["error"]["key"]) == (400, "not_an_operator"), (method, answer)
        assert repr(team.users[member].username) in answer["error"]["detail"]
    assert [m.username for m in ApproverGroup.objects.get(workspace=team.workspace).members.all()] == [
        team.users["operator"].username
    ]


@pytest.mark.parametrize("raw", ["{", '{"name": "finance", "tools": ["a"]', "\x00", '{"name": 1e400}'])
def test_a_malformed_body_is_a_typed_400(team: Team, raw: str) -> None:
    status, answer = team.api("operator").post(f"/workspaces/{team.slug}/approver-groups", raw=raw)
    assert status == 400 and isinstance(answer, dict) and answer["error"]["key"], answer
    assert not ApproverGroup.objects.filter(workspace=team.workspace).exists()


def test_the_openapi_document_lists_the_routes_and_their_bodies(team: Team) -> None:
    status, document = team.api("viewer").get("/openapi.json")
    assert status == 200
    paths = document["paths"]
    assert {"get", "post"} <= set(paths["/api/v1/workspaces/{ws}/approver-groups"])
    assert {"put", "delete"} <= set(paths["/api/v1/workspaces/{ws}/approver-groups/{approver_group_id}"])
    assert {"get", "put"} <= set(paths["/api/v1/workspaces/{ws}/wait-deadlines"])
    schema = paths["/api/v1/workspaces/{ws}/approver-groups"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["name", "tools", "members"] and not schema["additionalProperties"]
    assert "tools" in json.dumps(schema)


# ---- deadlines' API ----


@pytest.mark.parametrize("role,expected", [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 200)])
def test_only_an_operator_sets_the_deadlines_and_every_member_reads_them(team: Team, role: str, expected: int) -> None:
    group(team.workspace, "leads", ["*"])
    body = {"reminder_seconds": 600, "escalation_seconds": 0, "escalate_to": "leads"}
    status, answer = team.api(role).call("PUT", f"/workspaces/{team.slug}/wait-deadlines", body)
    assert status == expected, answer
    status, read = team.api(role).get(f"/workspaces/{team.slug}/wait-deadlines")
    assert status == (404 if role == "outsider" else 200)
    if status == 200:
        changed = (read["reminder_seconds"], read["escalation_seconds"], read["escalate_to"])
        assert changed == ((600, 0, "leads") if expected == 200 else (None, None, None))
        assert read["default_reminder_seconds"] == 3600 and read["default_escalation_seconds"] == 4 * 3600


@pytest.mark.parametrize(
    "body,key",
    [
        ({"reminder_seconds": -1}, "invalid_deadlines"),
        ({"reminder_seconds": "600"}, "invalid_deadlines"),
        ({"reminder_seconds": True}, "invalid_deadlines"),
        ({"reminder_seconds": 10**12}, "invalid_deadlines"),
        ({"reminder_seconds": 600, "escalation_seconds": 600}, "invalid_deadlines"),
        ({"reminder_seconds": 20000}, "invalid_deadlines"),  # after the default escalation (4 h)
        ({"escalate_to": "nobody"}, "invalid_escalate_to"),
        ({"escalate_to": {"name": "x"}}, "invalid_escalate_to"),
        ({"when": 1}, "unknown_field"),
        ([600], "invalid_request"),
    ],
)
def test_bad_deadlines_are_typed_and_change_nothing(team: Team, body: Any, key: str) -> None:
    status, answer = team.api("operator").call("PUT", f"/workspaces/{team.slug}/wait-deadlines", body)
    assert (status, answer["error"]["key"]) == (400, key), answer
    assert Workspace.objects.filter(pk=team.workspace.pk).values_list("reminder_seconds", "escalation_seconds").get() == (
        None,
        None,
    )
