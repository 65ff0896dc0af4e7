"""Edit, then approve (issue 30, item 1): a person changes a waiting call's arguments and approves
it in one kernel verb. The edited call gets its own digest, the trace holds both calls and who
edited, the model is told, and every refusal changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from runs import kernel
from runs.kernel import call_digest
from runs.models import Run, TraceEvent
from runs.selectors import event_document
from runs.worker.round_driver import tool_message
from tests.conftest import Team
from tests.runs.driver import drive, task


def create(team: Team, *calls: tuple[str, dict[str, Any]], approval: dict[str, Any] | None = None) -> Run:
    script = [{"tool_calls": [{"tool": tool, "args": args} for tool, args in calls]}, {"text": "done"}]
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={
            "tasks": [{"key": "r1", "kind": "round", "model": "script", "prompt": "go", "script": script}],
            "deliverable": "r1",
            "approval": approval or {"mode": "ask"},
        },
    )
    return drive(run)


def verbs(run: Run, key: str) -> list[TraceEvent]:
    return list(TraceEvent.objects.filter(run=run, task_key=key, event="verb").order_by("seq"))


def unchanged(run: Run, key: str, args: dict[str, Any]) -> bool:
    call = task(run, key)
    return call.status == "needs_approval" and call.spec["args"] == args and call.approved_digest is None and not verbs(run, key)


@pytest.mark.spec("S5", "S6")
def test_it_runs_the_edited_call_bound_to_its_own_digest(team: Team) -> None:
    run = create(team, ("test.echo", {"value": "rm -rf /"}))
    before = call_digest("test.echo", {"value": "rm -rf /"})
    kernel.approve_edited(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=before, args={"value": "ls"})
    edited = call_digest("test.echo", {"value": "ls"})
    call = task(run, "r1.1")
    assert call.approved_digest == edited and call.spec["args"] == {"value": "ls"}
    assert call.state["edited_by"] == team.users["operator"].username
    [verb] = verbs(run, "r1.1")
    assert verb.actor == team.users["operator"].username
    assert verb.data == {
        "verb": "approve",
        "digest": edited,
        "edited": True,
        "original_digest": before,
        "original_args": {"value": "rm -rf /"},
        "args": {"value": "ls"},
    }
    run = drive(run)
    assert task(run, "r1.1").result["value"] == "ls" and run.status == "completed"


def test_the_model_reads_that_a_person_edited_its_arguments(team: Team) -> None:
    run = create(team, ("test.echo", {"value": "a"}))
    editor = team.users["operator"].username
    kernel.approve_edited(
        run_id=run.pk,
        key="r1.1",
        user=team.users["operator"],
        digest=call_digest("test.echo", {"value": "a"}),
        args={"value": "b"},
    )
    run = drive(run)
    message = tool_message(task(run, "r1.1"))
    assert message["edited"] == {"by": editor, "args": {"value": "b"}, "note": f"{editor} edited your arguments before approving"}
    assert message["content"].startswith(f"[{editor} edited your arguments before approving: ")
    assert message["content"].endswith("\nb")


@pytest.mark.spec("F11", "F12")
def test_a_closed_reader_sees_that_a_call_was_edited_never_the_arguments(team: Team) -> None:
    run = create(team, ("test.echo", {"value": "secret"}))
    kernel.approve_edited(
        run_id=run.pk,
        key="r1.1",
        user=team.users["operator"],
        digest=call_digest("test.echo", {"value": "secret"}),
        args={"value": "other secret"},
    )
    [verb] = verbs(run, "r1.1")
    assert event_document(verb, content=False)["data"] == {"verb": "approve", "edited": True}
    assert event_document(verb, content=True)["data"]["original_args"] == {"value": "secret"}


def test_unchanged_arguments_are_a_plain_approval(team: Team) -> None:
    run = create(team, ("test.echo", {"value": 1}))
    digest = call_digest("test.echo", {"value": 1})
    kernel.approve_edited(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=digest, args={"value": 1})
    [verb] = verbs(run, "r1.1")
    assert verb.data == {"verb": "approve", "digest": digest} and "edited_by" not in task(run, "r1.1").state


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_ARGS = [
    ("a list", [1, 2], "invalid_args", 400),
    ("a text", "value", "invalid_args", 400),
    ("a NUL byte", {"value": "a\x00b"}, "nul_byte", 400),
    ("huge", {"value": "x" * (kernel.MAX_PAYLOAD_BYTES + 1)}, "payload_too_large", 413),
    ("too deep", {"a": nested(kernel.MAX_DEPTH + 2)}, "too_deep", 400),
]


@pytest.mark.parametrize(("name", "args", "key", "status"), BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
def test_bad_arguments_are_a_typed_refusal_and_change_nothing(team: Team, name: str, args: Any, key: str, status: int) -> None:
    run = create(team, ("test.echo", {"value": 1}))
    with pytest.raises(kernel.KernelError) as refused:
        kernel.approve_edited(
            run_id=run.pk, key="r1.1", user=team.users["operator"], digest=call_digest("test.echo", {"value": 1}), args=args
        )
    assert (refused.value.key, refused.value.status) == (key, status)
    assert unchanged(run, "r1.1", {"value": 1})


@pytest.mark.spec("S6")
def test_an_edit_of_a_call_that_changed_since_is_stale(team: Team) -> None:
    run = create(team, ("test.echo", {"value": 1}))
    with pytest.raises(kernel.Conflict) as refused:
        kernel.approve_edited(
            run_id=run.pk,
            key="r1.1",
            user=team.users["operator"],
            digest=call_digest("test.echo", {"value": 2}),
            args={"value": 3},
        )
    assert refused.value.key == "approval_stale" and unchanged(run, "r1.1", {"value": 1})
    with pytest.raises(kernel.InvalidRequest):
        kernel.approve_edited(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=None, args={"value": 3})


@pytest.mark.spec("S5")
def test_a_rule_that_denies_the_edited_call_beats_the_person(team: Team) -> None:
    rules = [{"tool": "test.echo", "decision": "deny", "when": {"args.value": {"prefix": "/etc"}}}]
    run = create(team, ("test.echo", {"value": "/tmp/x"}), approval={"mode": "rules", "rules": rules})
    assert task(run, "r1.1").status == "needs_approval"
    with pytest.raises(kernel.Conflict) as refused:
        kernel.approve_edited(
            run_id=run.pk,
            key="r1.1",
            user=team.users["operator"],
            digest=call_digest("test.echo", {"value": "/tmp/x"}),
            args={"value": "/etc/passwd"},
        )
    assert refused.value.key == "edit_denied_by_rule" and unchanged(run, "r1.1", {"value": "/tmp/x"})


def test_an_edit_cannot_make_a_call_replayable(team: Team) -> None:
    run = create(team, ("test.remote", {"id": "e1"}))
    with pytest.raises(kernel.Conflict) as refused:
        kernel.approve_edited(
            run_id=run.pk,
            key="r1.1",
            user=team.users["operator"],
            digest=call_digest("test.remote", {"id": "e1"}),
            args={"id": "e1", "replayable": True},
            confirm_effects=True,
        )
    assert refused.value.key == "edit_changes_replayability" and unchanged(run, "r1.1", {"id": "e1"})


@pytest.mark.spec("S10")
def test_a_call_with_effects_needs_its_confirmation_when_the_console_asked(team: Team) -> None:
    run = create(team, ("test.effect", {"id": "e1"}))
    digest = call_digest("test.effect", {"id": "e1"})
    with pytest.raises(kernel.Conflict) as refused:
        kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=digest, confirm_effects=False)
    assert refused.value.key == "effects_unconfirmed" and unchanged(run, "r1.1", {"id": "e1"})
    with pytest.raises(kernel.Conflict):
        kernel.approve_edited(
            run_id=run.pk, key="r1.1", user=team.users["operator"], digest=digest, args={"id": "e2"}, confirm_effects=False
        )
    assert unchanged(run, "r1.1", {"id": "e1"})
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=digest, confirm_effects=True)
    assert task(run, "r1.1").status != "needs_approval"


def test_a_replayable_call_needs_no_confirmation(team: Team) -> None:
    run = create(team, ("test.echo", {"value": 1}))
    kernel.approve(run_id=run.pk, key="r1.1", user=team.users["operator"], confirm_effects=False)
    assert task(run, "r1.1").approved_digest == call_digest("test.echo", {"value": 1})


@pytest.mark.spec("F11")
@pytest.mark.parametrize("role", ["reader", "viewer", "outsider"])
def test_only_an_operator_edits(team: Team, role: str) -> None:
    run = create(team, ("test.echo", {"value": 1}))
    with pytest.raises(kernel.KernelError) as refused:
        kernel.approve_edited(
            run_id=run.pk, key="r1.1", user=team.users[role], digest=call_digest("test.echo", {"value": 1}), args={"value": 2}
        )
    assert refused.value.status in (403, 404)
    assert unchanged(run, "r1.1", {"value": 1})


@pytest.mark.spec("S6")
def test_the_second_of_two_deciders_is_told_not_pending(team: Team) -> None:
    run = create(team, ("test.echo", {"value": 1}))
    digest = call_digest("test.echo", {"value": 1})
    kernel.deny(run_id=run.pk, key="r1.1", user=team.users["operator"], reason="no")
    with pytest.raises(kernel.Conflict) as refused:
        kernel.approve_edited(run_id=run.pk, key="r1.1", user=team.users["operator"], digest=digest, args={"value": 2})
    assert refused.value.key == "not_pending" and task(run, "r1.1").spec["args"] == {"value": 1}
