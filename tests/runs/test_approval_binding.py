"""Approvals bound to what was approved (issue 15, item 5): an approval is the digest of the call's
tool and arguments; the call runs with exactly those, or passes the stage again."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from runs import kernel
from runs.kernel import call_digest, spec_digest
from runs.models import Run, Task, TraceEvent
from tests.conftest import Team
from tests.runs.driver import drive, statuses, step, task


def round_with(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    script = [{"tool_calls": [{"tool": tool, "args": args} for tool, args in calls]}, {"text": "done"}]
    return {"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script}


def create(team: Team, approval: dict[str, Any], *calls: tuple[str, dict[str, Any]]) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [round_with(*calls)], "deliverable": "r1", "approval": approval},
    )
    return drive(run)


def reauthor(run: Run, key: str, args: dict[str, Any]) -> None:
    """Something re-authors a waiting call's arguments: any writer, under the run's row lock as
    every writer of the run takes it."""
    with transaction.atomic():
        Run.objects.select_for_update().get(pk=run.pk)
        call = Task.objects.get(run=run, key=key)
        Task.objects.filter(pk=call.pk).update(spec={**call.spec, "args": args})


def events(run: Run, key: str, name: str) -> list[TraceEvent]:
    return list(TraceEvent.objects.filter(run=run, task_key=key, event=name).order_by("seq"))


def ran(run: Run, key: str) -> bool:
    return TraceEvent.objects.filter(run=run, task_key=key, event="status", to_status="running").exists()


# ---- the digest ----


def test_the_digest_is_canonical_json_of_tool_and_args() -> None:
    assert call_digest("t", {"b": 1, "a": [1, "x"]}) == call_digest("t", {"a": [1, "x"], "b": 1})
    assert call_digest("t", {"a": 1}) != call_digest("t", {"a": True})
    assert call_digest("t", {"a": 1}) != call_digest("u", {"a": 1})
    assert call_digest("t", {"a": "é"}) != call_digest("t", {"a": "e"})
    assert spec_digest({"tool": "t", "args": {"a": 1}}) == call_digest("t", {"a": 1})
    assert len(call_digest("t", None)) == 64 and call_digest("t", None) == call_digest("t", {})


@pytest.mark.spec("S5", "S6")
def test_approve_binds_the_digest_on_the_task_and_in_the_trace_and_the_call_runs_with_those_args(team: Team) -> None:
    run = create(team, {"mode": "ask"}, ("test.echo", {"value": "hello"}))
    assert task(run, "r1.1").status == "needs_approval"
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"])
    expected = call_digest("test.echo", {"value": "hello"})
    assert task(run, "r1.1").approved_digest == expected
    [verb] = events(run, "r1.1", "verb")
    assert verb.data == {"verb": "approve", "digest": expected} and verb.actor
    run = drive(run)
    call = task(run, "r1.1")
    assert call.status == "completed" and call.result["value"] == "hello"


@pytest.mark.spec("S6")
def test_a_call_reauthored_after_approval_goes_back_to_needs_approval_and_never_runs_with_the_new_args(team: Team) -> None:
    run = create(team, {"mode": "ask"}, ("test.echo", {"value": "safe"}))
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"])
    approved = task(run, "r1.1").approved_digest
    reauthor(run, "r1.1", {"value": "rm -rf /"})
    run = drive(run)
    call = task(run, "r1.1")
    assert call.status == "needs_approval" and call.approved_digest is None and call.result is None
    assert not ran(run, "r1.1")
    [revoked] = events(run, "r1.1", "approval_revoked")
    assert revoked.data == {
        "reason": "call_changed",
        "approved": approved,
        "digest": call_digest("test.echo", {"value": "rm -rf /"}),
    }
    assert run.status == "running" and run.announcements == ["approval_required"]
    # The new call is decided on its own: approved, it runs with the arguments now shown.
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"])
    run = drive(run)
    assert task(run, "r1.1").result["value"] == "rm -rf /" and run.status == "completed"


@pytest.mark.spec("S6")
def test_a_runner_call_reauthored_after_approval_is_not_leased(team: Team) -> None:
    run = create(team, {"mode": "ask"}, ("test.remote", {"value": 1}))
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"])
    assert task(run, "r1.1").status == "dispatched"
    reauthor(run, "r1.1", {"value": 2})
    executor = uuid.uuid4()

    def lease() -> kernel.LeasedCall | None:
        return kernel.claim_call(
            executor_id=executor,
            executor_name="ex",
            tools=["test.remote"],
            workspace_ids=[team.workspace.pk],
            owner_id=team.users["operator"].pk,
        )

    assert lease() is None
    call = task(run, "r1.1")
    assert call.status == "needs_approval" and call.claim is None
    assert events(run, "r1.1", "approval_revoked")
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"])
    leased = lease()
    assert leased is not None and leased.args == {"value": 2}


@pytest.mark.spec("S6")
def test_a_quick_batch_claim_leaves_a_reauthored_call_unclaimed(team: Team) -> None:
    run = create(team, {"mode": "ask"}, ("test.echo", {"value": 1}), ("test.echo", {"value": 2}))
    for key in ("r1.1", "r1.2"):
        kernel.approve(run_id=run.pk, key=key, user=team.users["operator"])
    reauthor(run, "r1.2", {"value": 3})
    claimed = kernel.claim_batch(run.pk, [task(run, "r1.1").pk, task(run, "r1.2").pk], "batch")
    assert [c.key for c in claimed] == ["r1.1"]
    assert statuses(run)["r1.2"] == "needs_approval" and events(run, "r1.2", "approval_revoked")


# ---- the digest the approver saw ----


@pytest.mark.spec("S6")
def test_a_stale_digest_from_the_client_is_409_and_changes_nothing(team: Team) -> None:
    run = create(team, {"mode": "ask"}, ("test.echo", {"value": "seen"}))
    status, inbox = team.api().get(f"/inbox?workspace={team.slug}&kind=approval")
    [item] = inbox["items"]
    assert status == 200 and item.get("args") == {"value": "seen"}, inbox
    seen = item["digest"]
    assert seen == call_digest("test.echo", {"value": "seen"})
    reauthor(run, "r1.1", {"value": "not seen"})
    run.refresh_from_db()
    seq = run.last_seq
    status, body = team.api().post(f"/runs/{run.pk}/tasks/r1.1/approve", {"digest": seen})
    assert status == 409 and body["error"]["key"] == "approval_stale"
    run.refresh_from_db()
    call = task(run, "r1.1")
    assert run.last_seq == seq and call.status == "needs_approval" and call.approved_digest is None
    # Read again, approve what is shown now.
    status, inbox = team.api().get(f"/inbox?workspace={team.slug}&kind=approval")
    fresh = inbox["items"][0]["digest"]
    status, body = team.api().post(f"/runs/{run.pk}/tasks/r1.1/approve", {"digest": fresh})
    assert status == 200
    assert task(run, "r1.1").approved_digest == fresh


@pytest.mark.parametrize(
    "raw",
    [
        '{"digest": "abc"}',
        '{"digest": 12}',
        '{"digest": {"a": [1, 2]}}',
        '{"digest": "' + "A" * 64 + '"}',
        '{"digest": "' + "0" * 50_000 + '"}',
        '{"digest": ',
        '["digest"]',
    ],
)
def test_a_malformed_digest_is_a_typed_400_and_writes_nothing(team: Team, raw: str) -> None:
    run = create(team, {"mode": "ask"}, ("test.echo", {"value": 1}))
    seq = run.last_seq
    status, body = team.api().call("POST", f"/runs/{run.pk}/tasks/r1.1/approve", raw=raw)
    assert status == 400 and body["error"]["key"], body
    run.refresh_from_db()
    assert run.last_seq == seq and task(run, "r1.1").status == "needs_approval"


@pytest.mark.parametrize(("role", "expected"), [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 200)])
def test_approving_with_a_digest_takes_write_standing(team: Team, role: str, expected: int) -> None:
    run = create(team, {"mode": "ask"}, ("test.echo", {"value": 1}))
    digest = call_digest("test.echo", {"value": 1})
    status, _ = team.api(role).post(f"/runs/{run.pk}/tasks/r1.1/approve", {"digest": digest})
    assert status == expected
    assert (task(run, "r1.1").approved_digest == digest) is (expected == 200)


def test_the_console_approve_carries_the_digest_the_page_showed(team: Team) -> None:
    run = create(team, {"mode": "ask"}, ("test.echo", {"value": "shown"}))
    client = Client()
    client.force_login(team.users["operator"])
    page = client.get(f"/w/{team.slug}/inbox/").content.decode()
    digest = call_digest("test.echo", {"value": "shown"})
    assert f'name="digest" value="{digest}"' in page
    reauthor(run, "r1.1", {"value": "swapped"})
    answer = client.post(f"/runs/{run.pk}/tasks/r1.1/approve/", {"digest": digest}, HTTP_HX_REQUEST="true")
    assert "The call changed" in answer.content.decode()
    assert task(run, "r1.1").status == "needs_approval" and task(run, "r1.1").approved_digest is None
    fresh = client.get(f"/w/{team.slug}/inbox/").content.decode()
    new_digest = call_digest("test.echo", {"value": "swapped"})
    assert f'name="digest" value="{new_digest}"' in fresh
    client.post(f"/runs/{run.pk}/tasks/r1.1/approve/", {"digest": new_digest}, HTTP_HX_REQUEST="true")
    assert task(run, "r1.1").approved_digest == new_digest


# ---- who sees the arguments ----


@pytest.mark.spec("F11", "F12")
def test_a_viewer_sees_the_tool_but_not_the_args_in_the_inbox_api_or_page(team: Team) -> None:
    create(team, {"mode": "ask"}, ("test.echo", {"value": "the-secret-argument"}))
    status, inbox = team.api("viewer").get(f"/inbox?workspace={team.slug}")
    [item] = inbox["items"]
    assert status == 200 and item["tool"] == "test.echo"
    assert "args" not in item and "digest" not in item and "the-secret-argument" not in str(inbox)
    client = Client()
    client.force_login(team.users["viewer"])
    page = client.get(f"/w/{team.slug}/inbox/").content.decode()
    assert "test.echo" in page and "the-secret-argument" not in page and 'name="digest"' not in page
    assert call_digest("test.echo", {"value": "the-secret-argument"}) not in page
    status, inbox = team.api("reader").get(f"/inbox?workspace={team.slug}")
    assert inbox["items"][0]["args"] == {"value": "the-secret-argument"}


@pytest.mark.spec("F11", "F12")
def test_a_viewer_sees_no_digest_or_rule_name_in_the_trace(team: Team) -> None:
    rules = [{"name": "scratch files", "tool": "test.echo", "decision": "allow", "when": {"args.path": {"prefix": "/tmp/"}}}]
    run = create(team, {"mode": "rules", "rules": rules}, ("test.echo", {"path": "/tmp/a"}))
    status, trace = team.api("viewer").get(f"/runs/{run.pk}/trace")
    granted = [e for e in trace["events"] if e["event"] == "approval_granted"]
    assert (
        status == 200 and granted and all("digest" not in (e["data"] or {}) and "rule" not in (e["data"] or {}) for e in granted)
    )
    status, trace = team.api("reader").get(f"/runs/{run.pk}/trace")
    granted = [e for e in trace["events"] if e["event"] == "approval_granted"]
    assert granted[0]["data"]["rule"] == "scratch files"


# ---- rules that match arguments ----


@pytest.mark.spec("S5")
def test_rules_match_argument_values_and_the_deciding_rule_is_named_in_the_trace(team: Team) -> None:
    rules = [
        {"tool": "test.echo", "decision": "deny", "when": {"args.path": {"one_of": ["/etc/passwd", "/etc/shadow"]}}},
        {"name": "scratch files", "tool": "test.echo", "decision": "allow", "when": {"args.path": {"prefix": "/tmp/"}}},
        {"name": "dry runs", "tool": "test.*", "decision": "allow", "when": {"args.opts.dry": {"equals": True}}},
    ]
    run = create(
        team,
        {"mode": "rules", "rules": rules},
        ("test.echo", {"path": "/tmp/work/a.txt"}),
        ("test.echo", {"path": "/etc/passwd"}),
        ("test.echo", {"path": "/tmp/../etc/passwd"}),
        ("test.echo", {"path": "/var/log"}),
        ("test.echo", {"opts": {"dry": True}}),
        ("test.echo", {"opts": {"dry": 1}}),
        ("test.echo", {}),
    )
    states = statuses(run)
    assert states["r1.1"] == "completed"
    assert events(run, "r1.1", "approval_granted")[0].data == {
        "by": "rules",
        "rule": "scratch files",
        "digest": call_digest("test.echo", {"path": "/tmp/work/a.txt"}),
    }
    assert states["r1.2"] == "failed" and task(run, "r1.2").error_key == "approval_denied"
    assert events(run, "r1.2", "approval_denied")[0].data["rule"] == 0
    # A `..` climbs out of any prefix: no rule decides it, a person does.
    assert states["r1.3"] == "needs_approval" and not events(run, "r1.3", "approval_granted")
    assert states["r1.4"] == "needs_approval"
    assert states["r1.5"] == "completed" and events(run, "r1.5", "approval_granted")[0].data["rule"] == "dry runs"
    # JSON equality: 1 is not true; an argument the call lacks matches nothing.
    assert states["r1.6"] == "needs_approval" and states["r1.7"] == "needs_approval"


@pytest.mark.spec("S5")
def test_a_rule_granted_call_reauthored_before_its_claim_is_decided_again(team: Team) -> None:
    rules = [{"tool": "test.echo", "decision": "allow", "when": {"args.path": {"prefix": "/tmp/"}}}]
    body = {
        "tasks": [round_with(("test.echo", {"path": "/tmp/a"}))],
        "deliverable": "r1",
        "approval": {"mode": "rules", "rules": rules},
    }
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body=body)
    assert step(run, task(run, "r1"))  # only the round: it authors the call, which the rule grants
    assert task(run, "r1.1").approved_digest == call_digest("test.echo", {"path": "/tmp/a"})
    reauthor(run, "r1.1", {"path": "/home/me/.ssh/id_rsa"})
    assert kernel.claim_task(run.pk, task(run, "r1.1").pk, "w") is None
    assert statuses(run)["r1.1"] == "needs_approval" and events(run, "r1.1", "approval_revoked")


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            {"tool": "test.echo", "decision": "allow", "when": {"args.path": {"regex": ".*"}}},
            "approval.rules[0].when[args.path].regex",
        ),
        ({"tool": "test.echo", "decision": "allow", "when": {"path": {"prefix": "/tmp/"}}}, "approval.rules[0].when[path]"),
        (
            {"tool": "test.echo", "decision": "allow", "when": {"args.path": {"prefix": 3}}},
            "approval.rules[0].when[args.path].prefix",
        ),
        ({"tool": "test.echo", "decision": "allow", "when": {"args.x": {"one_of": []}}}, "approval.rules[0].when[args.x].one_of"),
        (
            {"tool": "test.echo", "decision": "allow", "when": {"args.x": {"equals": {"a": 1}}}},
            "approval.rules[0].when[args.x].equals",
        ),
        ({"tool": "test.echo", "decision": "allow", "when": "args.x == 1"}, "approval.rules[0].when"),
        ({"tool": "test.echo", "decision": "allow", "eval": "True"}, "approval.rules[0]"),
    ],
)
def test_a_run_with_a_bad_matcher_is_refused_with_a_typed_400(team: Team, rule: dict[str, Any], message: str) -> None:
    body = {"tasks": [round_with(("test.echo", {}))], "deliverable": "r1", "approval": {"mode": "rules", "rules": [rule]}}
    count = Run.objects.filter(workspace=team.workspace).count()
    status, answer = team.api().post(f"/workspaces/{team.slug}/runs", body)
    assert status == 400, answer
    assert answer["error"]["key"] in ("invalid_field", "invalid_request")
    if answer["error"]["key"] == "invalid_field":
        assert message in answer["error"]["detail"]
    assert Run.objects.filter(workspace=team.workspace).count() == count


# ---- races ----


@pytest.mark.spec("S6")
@pytest.mark.usefixtures("committed", "no_dispatch")
def test_approve_racing_a_reauthor_is_decided_once_and_never_runs_unapproved_args() -> None:
    from tests.runs.test_concurrency import race

    team = Team()
    outcomes = set()
    seen = call_digest("test.echo", {"value": "old"})
    for _ in range(6):
        run = create(team, {"mode": "ask"}, ("test.echo", {"value": "old"}))
        approved, _ = race(
            lambda run=run: kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=seen),
            lambda run=run: reauthor(run, "r1.1", {"value": "new"}),
        )
        run = drive(run)
        call = task(run, "r1.1")
        # Whichever came first, the new arguments never ran without an approval of their own.
        assert call.status == "needs_approval" and not ran(run, "r1.1") and call.approved_digest is None
        verbs = events(run, "r1.1", "verb")
        if isinstance(approved, kernel.KernelError):
            assert approved.key == "approval_stale" and verbs == [] and not events(run, "r1.1", "approval_revoked")
            outcomes.add("stale")
        else:
            assert len(verbs) == 1 and verbs[0].data["digest"] == seen
            assert len(events(run, "r1.1", "approval_revoked")) == 1
            outcomes.add("revoked")
    assert outcomes  # each round was decided one way, exactly once
