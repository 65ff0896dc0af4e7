"""`Idempotency-Key` on creates and appends: a client's retry after any error starts nothing twice;
and a request whose transaction committed answers its success even when the send after it fails."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from runs import idempotency, kernel
from runs.models import IdempotencyKey, Run, Task
from tests.conftest import Team
from tests.factories import make_member, make_token, make_workspace
from tests.runs.driver import echo


def post(token: str, path: str, body: Any, key: str | None = None, *, raw: str | None = None) -> tuple[int, Any]:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    response = Client(**headers).post(
        f"/api/v1{path}", raw if raw is not None else json.dumps(body), content_type="application/json"
    )
    return response.status_code, response.json()


def create(team: Team, body: dict[str, Any], key: str | None, role: str = "operator") -> tuple[int, Any]:
    return post(team.tokens[role], f"/workspaces/{team.slug}/runs", body, key)


def runs_of(team: Team) -> int:
    return Run.objects.filter(workspace=team.workspace).count()


BODY = {"tasks": [echo("a")], "deliverable": "a"}


def test_the_same_key_and_body_answer_the_first_answer_and_start_nothing_twice(team: Team) -> None:
    first = create(team, BODY, "retry-1")
    again = create(team, BODY, "retry-1")
    assert first[0] == again[0] == 201
    assert again[1] == first[1]
    assert runs_of(team) == 1


def test_key_order_and_spacing_do_not_make_another_request(team: Team) -> None:
    status, first = create(team, {"deliverable": "a", "tasks": [echo("a")]}, "same-meaning")
    task = echo("a")
    raw = json.dumps({"tasks": [dict(reversed(task.items()))], "deliverable": "a"}, indent=3)
    again = post(team.tokens["operator"], f"/workspaces/{team.slug}/runs", None, "same-meaning", raw=raw)
    assert status == 201 and again == (201, first)
    assert runs_of(team) == 1


def test_the_same_key_with_another_body_is_a_typed_409_and_changes_nothing(team: Team) -> None:
    assert create(team, BODY, "k")[0] == 201
    status, answer = create(team, {"tasks": [echo("b")], "deliverable": "b"}, "k")
    assert status == 409 and answer["error"]["key"] == "idempotency_key_reused"
    assert runs_of(team) == 1


def test_without_a_key_every_request_runs(team: Team) -> None:
    assert create(team, BODY, None)[0] == 201
    assert create(team, BODY, None)[0] == 201
    assert runs_of(team) == 2


def test_keys_are_scoped_to_the_workspace_and_the_caller(team: Team) -> None:
    other_operator = make_token(user=make_member(workspace=team.workspace, role="operator"))
    assert create(team, BODY, "shared")[0] == 201
    status, answer = post(other_operator, f"/workspaces/{team.slug}/runs", BODY, "shared")
    assert status == 201  # another caller's key of the same name is another key
    elsewhere = make_workspace()
    from tenancy.models import Membership

    Membership.objects.create(workspace=elsewhere, user=team.users["operator"], role="operator")
    status, _ = post(team.tokens["operator"], f"/workspaces/{elsewhere.slug}/runs", BODY, "shared")
    assert status == 201  # and the same caller's, in another workspace
    assert runs_of(team) == 2 and Run.objects.filter(workspace=elsewhere).count() == 1


def test_a_refused_request_keeps_no_answer_and_its_corrected_retry_runs(team: Team) -> None:
    status, answer = create(team, {"tasks": [echo("a")], "deliverable": "zz"}, "fix-me")
    assert status == 400 and answer["error"]["key"] == "unknown_deliverable"
    assert not IdempotencyKey.objects.filter(key="fix-me").exists()
    assert create(team, BODY, "fix-me")[0] == 201


@pytest.mark.parametrize("key", ["", " ", "a b", "x" * 256, "tab\there", "é", "nul\x00"])
def test_a_malformed_key_is_a_typed_400_and_nothing_runs(team: Team, key: str) -> None:
    status, answer = create(team, BODY, key)
    assert status == 400 and answer["error"]["key"] in ("invalid_idempotency_key", "nul_byte"), answer
    assert runs_of(team) == 0


@pytest.mark.parametrize("role,expected", [("viewer", 403), ("reader", 403), ("outsider", 404)])
def test_a_key_changes_nobodys_standing(team: Team, role: str, expected: int) -> None:
    status, _ = create(team, BODY, "standing", role)
    assert status == expected
    assert runs_of(team) == 0 and not IdempotencyKey.objects.filter(key="standing").exists()


def test_an_append_with_a_key_is_applied_once(team: Team) -> None:
    status, created = create(team, {"tasks": [{"key": "gate", "kind": "await"}], "deliverable": "gate"}, None)
    assert status == 201
    run_id = created["run"]["id"]
    append = {"tasks": [echo("b")]}
    first = post(team.tokens["operator"], f"/runs/{run_id}/append", append, "append-1")
    again = post(team.tokens["operator"], f"/runs/{run_id}/append", append, "append-1")
    assert first[0] == 200 and again == first
    assert Task.objects.filter(run_id=run_id, key="b").count() == 1
    status, answer = post(team.tokens["operator"], f"/runs/{run_id}/append", {"tasks": [echo("c")]}, "append-1")
    assert status == 409 and answer["error"]["key"] == "idempotency_key_reused"
    # The create's keys and the append's share one space per workspace and caller.
    status, answer = create(team, BODY, "append-1")
    assert status == 409


def test_an_append_to_no_run_with_a_key_is_a_404(team: Team) -> None:
    status, answer = post(team.tokens["operator"], "/runs/not-a-uuid/append", {"tasks": [echo("b")]}, "k")
    assert status == 404, answer


def test_a_key_is_forgotten_after_its_time(team: Team, settings: Any) -> None:
    assert create(team, BODY, "old")[0] == 201
    IdempotencyKey.objects.filter(key="old").update(
        created_at=timezone.now() - timedelta(seconds=settings.OZ0_IDEMPOTENCY_SECONDS + 1)
    )
    assert create(team, BODY, "old")[0] == 201
    assert runs_of(team) == 2
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(seconds=settings.OZ0_IDEMPOTENCY_SECONDS + 1))
    assert idempotency.sweep_expired_keys() >= 1
    assert not IdempotencyKey.objects.filter(key="old").exists()


def test_the_openapi_document_names_the_header(team: Team) -> None:
    document = Client().get("/api/v1/openapi.json").json()
    for path in ("/api/v1/workspaces/{ws}/runs", "/api/v1/runs/{run_id}/append"):
        names = [p["name"] for p in document["paths"][path]["post"].get("parameters", [])]
        assert "Idempotency-Key" in names, path


def test_two_requests_racing_with_one_key_start_one_run(committed: None, no_dispatch: list[int]) -> None:
    team = Team()
    answers: list[tuple[int, Any]] = []
    barrier = threading.Barrier(4)

    def one() -> None:
        try:
            barrier.wait()
            answers.append(create(team, BODY, "race"))
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [status for status, _ in answers] == [201] * 4
    assert len({answer["run"]["id"] for _, answer in answers}) == 1
    assert runs_of(team) == 1


def test_a_committed_create_answers_201_when_the_send_after_commit_fails(committed: None) -> None:
    """The broker away (Redis down): the run is committed and its tasks queued in the database; the
    send after commit fails, and the request still answers its success (the lost-message sweep
    sends the tasks again). Before, the failed send turned the committed create into a 500."""

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    previous = kernel.install_sender(broker_down)
    try:
        team = Team()
        status, answer = create(team, BODY, "broker-down")
        assert status == 201, answer
        assert Run.objects.filter(pk=answer["run"]["id"]).exists()
        task = Task.objects.get(run_id=answer["run"]["id"], key="a")
        assert task.status == "waiting" and task.ready  # queued: the lost-message sweep sends it again
        # A client that never saw the answer retries with its key: the first answer, no second run.
        assert create(team, BODY, "broker-down") == (201, answer)
        assert runs_of(team) == 1
    finally:
        kernel.install_sender(previous)
