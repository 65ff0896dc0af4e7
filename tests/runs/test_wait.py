"""GET /runs/{id}/wait (GetJobWait): waits hold no database connection while idle, wake on the run's
channel-layer group, and one user may hold only so many at once (F12 for what a wait shows)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.db import connection
from django.test import Client

from runs import kernel, waits
from runs.models import Run
from tests.conftest import Team, own_session, wait_for
from tests.runs.driver import echo

pytestmark = pytest.mark.usefixtures("committed", "no_dispatch")


def _await_run(team: Team) -> Run:
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [{"key": "q", "kind": "await", "question": "?"}, echo("e", after=["q"])], "deliverable": "e"},
    )
    return Run.objects.get(pk=run.pk)


async def _wait(token: str, run_id: Any, *, after: int, timeout: float) -> tuple[int, dict[str, Any], dict[str, str]]:
    from oz0site.asgi import application

    communicator = HttpCommunicator(
        application,
        "GET",
        f"/api/v1/runs/{run_id}/wait?after={after}&timeout={timeout}",
        headers=[(b"authorization", f"Bearer {token}".encode()), (b"host", b"testserver")],
    )
    response = await communicator.get_response(timeout=timeout + 30)
    headers = {k.decode().lower(): v.decode() for k, v in response["headers"]}
    return response["status"], json.loads(response["body"]), headers


def _connections() -> int:
    """Sessions open on the test database, counted from a connection of our own."""
    with own_session(autocommit=True) as own:
        row = own.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0]) - 1


def test_it_holds_no_database_connection_while_a_wait_is_idle() -> None:
    """Before, each waiter polled every 50 ms for up to 60 s on a connection of its own: 120 viewers starved the workers."""
    team = Team()
    run = _await_run(team)
    connection.close()
    waiters = 12

    async def scenario() -> tuple[int, int, list[tuple[int, dict[str, Any], dict[str, str]]]]:
        before = await sync_to_async(_connections, thread_sensitive=False)()
        pending = [
            asyncio.ensure_future(_wait(team.tokens[role], run.pk, after=run.last_seq, timeout=4))
            for role in ("operator", "reader", "viewer")
            for _ in range(waiters // 3)
        ]
        await asyncio.sleep(1.5)  # every wait has read the run and gone to sleep
        during = await sync_to_async(_connections, thread_sensitive=False)()
        return before, during, list(await asyncio.gather(*pending))

    before, during, answers = asyncio.run(scenario())
    assert all(status == 200 and body["events"] == [] for status, body, _ in answers), answers
    assert during - before < 3, f"{during - before} connections held by {waiters} idle waits"


def test_it_wakes_a_wait_when_the_run_changes() -> None:
    team = Team()
    run = _await_run(team)
    connection.close()

    async def scenario() -> tuple[float, tuple[int, dict[str, Any], dict[str, str]]]:
        started = time.monotonic()
        pending = asyncio.ensure_future(_wait(team.tokens["viewer"], run.pk, after=run.last_seq, timeout=30))
        await asyncio.sleep(1.0)
        await sync_to_async(_append, thread_sensitive=False)(team, run)
        answer = await pending
        return time.monotonic() - started, answer

    # No periodic re-read could explain an early answer: only the group's message wakes the wait.
    original = waits.RECHECK_SECONDS
    waits.RECHECK_SECONDS = 60.0
    try:
        elapsed, (status, body, _) = asyncio.run(scenario())
    finally:
        waits.RECHECK_SECONDS = original
    assert status == 200 and body["events"] and body["events"][0]["event"] == "appended"
    assert elapsed < 20, f"the wait slept through the change ({elapsed:.1f}s of its 30 s)"


def _append(team: Team, run: Run) -> None:
    kernel.append(run_id=run.pk, user=team.users["operator"], body={"tasks": [echo("later")]})
    connection.close()


def test_it_caps_one_users_concurrent_waits_without_starving_another(settings: Any) -> None:
    settings.OZ0_WAITS_PER_USER = 2
    team = Team()
    run = _await_run(team)
    connection.close()

    async def scenario() -> dict[str, Any]:
        first = [asyncio.ensure_future(_wait(team.tokens["viewer"], run.pk, after=run.last_seq, timeout=3)) for _ in range(2)]
        await asyncio.sleep(1.0)
        refused = await _wait(team.tokens["viewer"], run.pk, after=run.last_seq, timeout=3)
        other = await _wait(team.tokens["reader"], run.pk, after=run.last_seq, timeout=0.5)
        done = await asyncio.gather(*first)
        again = await _wait(team.tokens["viewer"], run.pk, after=run.last_seq, timeout=0.2)
        return {"refused": refused, "other": other, "done": done, "again": again}

    result = asyncio.run(scenario())
    status, body, headers = result["refused"]
    assert status == 429 and body["error"]["key"] == "too_many_waits" and headers.get("retry-after") == "1"
    assert result["other"][0] == 200
    assert [answer[0] for answer in result["done"]] == [200, 200]
    assert result["again"][0] == 200


def test_it_answers_at_once_without_taking_a_slot_when_events_are_there(settings: Any) -> None:
    settings.OZ0_WAITS_PER_USER = 0
    team = Team()
    run = _await_run(team)
    status, body, _ = asyncio.run(_wait(team.tokens["viewer"], run.pk, after=0, timeout=5))
    assert status == 200 and body["events"] and body["events"][0]["seq"] == 1


@pytest.mark.parametrize("role,status", [("operator", 200), ("reader", 200), ("viewer", 200), ("outsider", 404)])
def test_it_answers_members_only(role: str, status: int) -> None:
    team = Team()
    run = _await_run(team)
    got, body, _ = asyncio.run(_wait(team.tokens[role], run.pk, after=0, timeout=0))
    assert got == status, body


def test_it_refuses_bad_input_typed() -> None:
    team = Team()
    run = _await_run(team)
    api = team.api("viewer")
    status, body = api.get(f"/runs/{run.pk}/wait?timeout=soon")
    assert status == 400 and body["error"]["key"] == "invalid_request"
    status, body = api.get(f"/runs/{run.pk}/wait?after=lots")
    assert status == 400
    status, body = api.get("/runs/not-a-run/wait?timeout=0")
    assert status == 404 and body["error"]["key"] == "not_found"
    # The document says 0-60 s, and the server holds to it (it used to clamp): issue 27.8.
    status, body = api.get(f"/runs/{run.pk}/wait?after=0&timeout=99999999999")
    assert status == 400 and body["error"]["key"] == "invalid_request"
    status, body = api.get(f"/runs/{run.pk}/wait?after=0&timeout=60")
    assert status == 200  # events are there already


def test_it_leaves_live_sockets_on_other_event_loops_working_while_it_waits() -> None:
    """Waits and websocket consumers share the process's channel layer. Before, a wait's receiver
    took the layer's receive section, which admits one event loop at a time: while any wait was
    open, every socket served from another loop failed to receive, and a wait whose loop never
    finished locked them out for the life of the process."""
    from oz0site.asgi import application

    team = Team()
    run = _await_run(team)
    client = Client()
    client.force_login(team.users["viewer"])
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    connection.close()
    answers: list[tuple[int, dict[str, Any], dict[str, str]]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(asyncio.run(_wait(team.tokens["viewer"], run.pk, after=10**6, timeout=6)))
    )
    waiting.start()
    wait_for(lambda: any(c.receiver is not None for c in list(waits._changes.values())), message="the wait to subscribe")
    time.sleep(0.5)  # its receiver is now receiving, on the wait thread's event loop

    async def live_socket() -> dict[str, Any]:
        communicator = WebsocketCommunicator(
            application,
            f"/ws/workspaces/{team.slug}/",
            headers=[(b"cookie", cookie.encode()), (b"origin", b"http://localhost"), (b"host", b"localhost")],
        )
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        try:
            await sync_to_async(_append, thread_sensitive=False)(team, run)
            return await communicator.receive_json_from(timeout=5)
        finally:
            await communicator.disconnect()

    try:
        pushed = async_to_sync(live_socket)()
    finally:
        waiting.join(30)
    assert pushed["run"] == str(run.pk) and pushed["type"] == "run.changed"
    assert answers and answers[0][0] == 200, answers
