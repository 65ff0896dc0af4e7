"""A verb's body has one validator, the kernel's shape (runs.kernel.request_shapes: RETRY_BODY,
REASON_BODY, ...), which also writes its OpenAPI schema (issue 28.2): a bad body gets the kernel's
typed key naming the field (ninja's body model used to answer first, `invalid_request` with its
own words), and changes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runs.models import Executor, Run, Task
from tests.conftest import Api, Team

# (path, body, key, words the detail holds); {run} and {token} are the staged run's.
BAD_VERB_BODIES: list[tuple[str, Any, str, str]] = [
    ("/runs/{run}/tasks/q/retry", {"confirm_calls": "q"}, "invalid_field", "`confirm_calls`"),
    ("/runs/{run}/tasks/q/retry", {"confirm_calls": ["q", 1]}, "invalid_field", "`confirm_calls`"),
    ("/runs/{run}/tasks/q/retry", False, "invalid_request", "JSON object"),
    ("/runs/{run}/tasks/q/approve", {"digest": "ABC"}, "invalid_field", "`digest`"),
    ("/runs/{run}/tasks/q/approve", {"digest": "a" * 64 + "\n"}, "invalid_field", "`digest`"),
    ("/runs/{run}/tasks/q/deny", {"reason": 5}, "invalid_field", "`reason`"),
    ("/runs/{run}/tasks/q/deny", {"reason": None}, "invalid_field", "`reason`"),
    ("/runs/{run}/cancel", {"reason": ["stop"]}, "invalid_field", "`reason`"),
    ("/runs/{run}/tasks/q/answer", None, "invalid_request", "JSON object"),
    ("/awaits/{token}", {"error": 5}, "invalid_field", "`error`"),
    ("/awaits/{token}", {"error": "   "}, "invalid_field", "`error`"),
    ("/awaits/{token}", {"value": 1, "error": "gone"}, "invalid_request", "not both"),
    ("/awaits", {"token": "{token}", "error": "x" * 2001}, "invalid_field", "`error`"),
    ("/awaits", {"value": 1}, "invalid_field", "`token` is required"),
]


def _staged_await(team: Team) -> tuple[str, str]:
    body = {"tasks": [{"key": "q", "kind": "await", "question": "Ship it?"}], "deliverable": "q"}
    status, created = team.api().post(f"/workspaces/{team.slug}/runs", body)
    assert status == 201, created
    return created["run"]["id"], created["receipt"]["tokens"]["q"]


def _filled(value: Any, run_id: str, token: str) -> Any:
    if isinstance(value, str):
        return value.replace("{run}", run_id).replace("{token}", token)
    if isinstance(value, dict):
        return {key: _filled(item, run_id, token) for key, item in value.items()}
    return value


@pytest.mark.parametrize("path,body,key,words", BAD_VERB_BODIES)
def test_a_verbs_bad_body_gets_the_kernels_key_and_changes_nothing(
    team: Team, path: str, body: Any, key: str, words: str
) -> None:
    run_id, token = _staged_await(team)
    seq = Run.objects.get(pk=run_id).last_seq
    status, answer = team.api().post(_filled(path, run_id, token), raw=_json(_filled(body, run_id, token)))
    assert (status, answer["error"]["key"]) == (400, key), answer
    assert words in answer["error"]["detail"], answer
    run = Run.objects.get(pk=run_id)
    assert (run.last_seq, run.status, Task.objects.get(run=run, key="q").status) == (seq, "running", "dispatched")


def test_a_verbs_good_body_still_reads_as_before(team: Team) -> None:
    """A body's fields the shape does not name are ignored, as ninja's model ignored them; an absent
    body of an optional shape is an empty one; a reason reaches the trace as it was given."""
    run_id, token = _staged_await(team)
    status, answer = team.api().post(f"/awaits/{token}", {"value": "yes", "note": "ignored"})
    assert status == 200 and answer["run"]["status"] == "completed", answer
    run_id, _ = _staged_await(team)
    status, answer = team.api().post(f"/runs/{run_id}/cancel", raw="")
    assert status == 200 and answer["run"]["status"] in ("canceling", "canceled"), answer
    run_id, _ = _staged_await(team)
    status, answer = team.api().post(f"/runs/{run_id}/cancel", {"reason": "enough"})
    assert status == 200, answer
    verbs = Run.objects.get(pk=run_id).trace.filter(event="verb").values_list("data", flat=True)
    assert {"verb": "cancel", "message": "enough"} in list(verbs)


def _json(value: Any) -> str:
    return json.dumps(value)


BAD_REGISTRATIONS: list[tuple[dict[str, Any], str]] = [
    ({"tools": "test.remote"}, "`tools`"),
    ({"tools": []}, "`tools`"),
    ({"tools": ["test.remote"] * 65}, "`tools`"),
    ({"tools": ["test.remote"], "name": None}, "`name`"),
    ({"tools": ["test.remote"], "name": "n" * 101}, "`name`"),
    ({"tools": ["test.remote"], "workspace": "no spaces"}, "`workspace`"),
    ({"name": "runner"}, "`tools` is required"),
]


@pytest.mark.spec("S8")
@pytest.mark.parametrize("body,words", BAD_REGISTRATIONS)
def test_a_bad_registration_gets_the_kernels_key(team: Team, body: dict[str, Any], words: str) -> None:
    status, answer = team.api().post("/executors", body)
    assert (status, answer["error"]["key"]) == (400, "invalid_field"), answer
    assert words in answer["error"]["detail"] and not Executor.objects.exists()


@pytest.mark.spec("S8")
@pytest.mark.parametrize(
    "body,key,words",
    [
        ({"ok": "yes"}, "invalid_field", "`ok`"),
        ({"value": 1}, "invalid_field", "`ok` is required"),
        ({"ok": False, "stopped": "no"}, "invalid_field", "`stopped`"),
        ({"ok": False, "error": 5}, "invalid_field", "`error`"),
        ([True], "invalid_request", "JSON object"),
    ],
)
def test_a_bad_result_gets_the_kernels_key_and_the_call_stays_held(team: Team, body: Any, key: str, words: str) -> None:
    status, created = team.api().post(
        f"/workspaces/{team.slug}/runs", {"tasks": [{"key": "a", "kind": "tool", "tool": "test.remote", "args": {"id": "a"}}]}
    )
    assert status == 201, created
    status, registered = team.api().post("/executors", {"tools": ["test.remote"]})
    assert status == 201, registered
    runner = Api(registered["token"])
    status, call = runner.post(f"/executors/{registered['id']}/claim")
    assert status == 200, call
    task = Task.objects.get(pk=call["call"])
    status, answer = runner.post(f"/executors/{registered['id']}/calls/{call['call']}/result", raw=_json(body))
    assert (status, answer["error"]["key"]) == (400, key), answer
    assert words in answer["error"]["detail"], answer
    after = Task.objects.get(pk=task.pk)
    assert (after.status, after.claim, after.attempt) == (task.status, task.claim, 1) and task.status == "dispatched"


@pytest.mark.parametrize("path", ["/runs/{run}/tasks/q/answer", "/awaits/{token}", "/awaits", "/executors"])
def test_a_required_body_left_out_is_refused(team: Team, path: str) -> None:
    """The document calls these bodies required: none at all is refused, as ninja's model refused it."""
    run_id, token = _staged_await(team)
    status, answer = team.api().post(_filled(path, run_id, token), raw="")
    assert (status, answer["error"]["key"]) == (400, "invalid_request"), answer
    assert Task.objects.get(run_id=run_id, key="q").status == "dispatched" and not Executor.objects.exists()
