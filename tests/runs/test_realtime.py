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
