"""Every committed run change is published to the run's group and the workspace's group."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from oz0site import realtime
from runs import kernel
from tests.conftest import Team
from tests.runs.driver import drive, echo, fail

pytestmark = pytest.mark.usefixtures("committed", "no_dispatch")


async def _next(layer: Any, channel: str, timeout: float = 5.0) -> dict[str, Any]:
    return await asyncio.wait_for(layer.receive(channel), timeout)


def test_it_publishes_committed_changes_to_the_run_and_workspace_groups() -> None:
    team = Team()
    layer = get_channel_layer()
    run_channel = async_to_sync(layer.new_channel)()
    ws_channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(realtime.workspace_group(team.workspace.pk), ws_channel)
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [fail("a", on_failure="halt"), echo("b", after=["a"])], "deliverable": "b"},
    )
    first = async_to_sync(_next)(layer, ws_channel)
    assert first["type"] == "run.changed" and first["run"] == str(run.pk) and first["seq"] >= 1
    async_to_sync(layer.group_add)(realtime.run_group(run.pk), run_channel)
    drive(run)
    messages = []
    while True:
        try:
            messages.append(async_to_sync(_next)(layer, run_channel, 2.0))
        except TimeoutError:
            break
    assert messages, "no message reached the run's group"
    last = messages[-1]
    assert last["status"] == "needs_attention" and last["attention"] == "halt_failure"
    # Signals carry statuses, keys and reasons: never an agent's or a tool's words.
    assert all("failed" not in str(m.get("detail", "")) for m in messages)
    assert not any("a failed" in str(m) for m in messages)


def test_it_publishes_nothing_for_a_change_that_rolled_back() -> None:
    team = Team()
    layer = get_channel_layer()
    ws_channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(realtime.workspace_group(team.workspace.pk), ws_channel)
    with pytest.raises(kernel.InvalidRequest):
        kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"tasks": [echo("a", after=["missing"])]})
    with pytest.raises(TimeoutError):
        async_to_sync(_next)(layer, ws_channel, 1.0)


@pytest.mark.parametrize("role,accepted", [("viewer", True), ("operator", True), ("outsider", False)])
def test_it_lets_only_members_subscribe(role: str, accepted: bool) -> None:
    from oz0site.asgi import application

    team = Team()
    run, _ = kernel.create_run(
        workspace=team.workspace, user=team.users["operator"], body={"tasks": [echo("a")], "deliverable": "a"}
    )
    from django.test import Client

    client = Client()
    client.force_login(team.users[role])
    cookie = f"sessionid={client.cookies['sessionid'].value}"

    async def connect() -> bool:
        communicator = WebsocketCommunicator(
            application,
            f"/ws/runs/{run.pk}/",
            headers=[(b"cookie", cookie.encode()), (b"origin", b"http://localhost"), (b"host", b"localhost")],
        )
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return bool(connected)

    assert async_to_sync(connect)() is accepted


def _drain(layer: Any, channel: str, quiet: float = 1.0) -> list[dict[str, Any]]:
    messages = []
    while True:
        try:
            messages.append(async_to_sync(_next)(layer, channel, quiet))
        except TimeoutError:
            return messages


def _change(run: str, seq: int, task: str) -> dict[str, Any]:
    return {
        "type": "run.changed",
        "run": run,
        "workspace": 1,
        "status": "running",
        "seq": seq,
        "attention": None,
        "tasks": [task],
    }


def test_it_folds_a_burst_of_one_runs_changes_into_its_last_push(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run changing hundreds of times a second (a fan of quick calls) costs at most one push per
    window; the push that ends the window carries the latest seq and every task the burst named."""
    monkeypatch.setattr(realtime, "COALESCE_SECONDS", 0.3)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    group = realtime.run_group("burst")
    async_to_sync(layer.group_add)(group, channel)
    for seq in range(1, 41):
        realtime.publish([group], _change("burst", seq, f"t{seq % 5}"))
    messages = _drain(layer, channel)
    # The first change at once, the other 39 folded into the push at the end of its window.
    assert [m["seq"] for m in messages] == [1, 40]
    assert sorted(messages[-1]["tasks"]) == ["t0", "t1", "t2", "t3", "t4"]


def test_a_busy_run_does_not_delay_another_runs_push(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realtime, "COALESCE_SECONDS", 0.5)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    for run in ("busy", "quiet"):
        async_to_sync(layer.group_add)(realtime.run_group(run), channel)
    realtime.publish([realtime.run_group("busy")], _change("busy", 1, "a"))
    realtime.publish([realtime.run_group("busy")], _change("busy", 2, "a"))  # waits for the window's end
    realtime.publish([realtime.run_group("quiet")], _change("quiet", 7, "q"))
    messages = [(m["run"], m["seq"]) for m in _drain(layer, channel)]
    # The two first pushes go out at once (their order between two runs is the layer's); the
    # busy run's second change waits for its window's end, and the quiet run's push does not.
    assert sorted(messages) == [("busy", 1), ("busy", 2), ("quiet", 7)]
    assert messages.index(("quiet", 7)) < messages.index(("busy", 2))


def test_it_never_folds_away_a_later_change_behind_an_earlier_one() -> None:
    later, earlier = _change("r", 9, "b"), _change("r", 4, "a")
    assert realtime.fold(later, earlier)["seq"] == 9 and realtime.fold(earlier, later)["seq"] == 9
    assert set(realtime.fold(earlier, later)["tasks"]) == {"a", "b"}
    many = realtime.fold({**earlier, "tasks": [f"x{i}" for i in range(40)]}, {**later, "tasks": [f"y{i}" for i in range(40)]})
    assert len(many["tasks"]) == 50
