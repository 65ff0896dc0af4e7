"""Live sockets re-check membership before every push: someone removed gets nothing more."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction
from django.test import Client

from oz0site import realtime
from runs import kernel
from tenancy.models import Membership
from tests.conftest import Team
from tests.runs.driver import echo

pytestmark = pytest.mark.usefixtures("committed", "no_dispatch")


def _cookie(team: Team, role: str) -> str:
    client = Client()
    client.force_login(team.users[role])
    return f"sessionid={client.cookies['sessionid'].value}"


def _communicator(path: str, cookie: str) -> WebsocketCommunicator:
    from oz0site.asgi import application

    return WebsocketCommunicator(
        application, path, headers=[(b"cookie", cookie.encode()), (b"origin", b"http://localhost"), (b"host", b"localhost")]
    )


def _create(team: Team) -> str:
    run, _ = kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"tasks": [echo("a")]})
    return str(run.pk)


def _remove(team: Team, role: str) -> None:
    Membership.objects.filter(user=team.users[role], workspace=team.workspace).delete()


@pytest.mark.parametrize("socket", ["workspace", "run"])
def test_it_stops_pushing_to_someone_removed_from_the_workspace(socket: str) -> None:
    """Before, a socket kept receiving every change after its person lost the membership it was opened with."""
    team = Team()
    first = _create(team)
    path = f"/ws/workspaces/{team.slug}/" if socket == "workspace" else f"/ws/runs/{first}/"
    communicator = _communicator(path, _cookie(team, "viewer"))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        connected, _ = await communicator.connect()
        assert connected
        try:
            realtime.publish([realtime.run_group(first), realtime.workspace_group(team.workspace.pk)], _change(first))
            while_member = await communicator.receive_json_from(timeout=5)
            await sync_to_async(_remove)(team, "viewer")
            realtime.publish([realtime.run_group(first), realtime.workspace_group(team.workspace.pk)], _change(first))
            after = await communicator.receive_output(timeout=5)
            return while_member, after
        finally:
            await communicator.disconnect()

    while_member, after = async_to_sync(scenario)()
    assert while_member["run"] == first
    assert after["type"] == "websocket.close" and after.get("code") == 4403, after


def test_a_removal_counts_from_its_commit_not_from_its_delete() -> None:
    """Before, the stamp moved at the delete, inside the removal's transaction: a push in between
    read the membership as committed (still a member), kept the new stamp, and the socket never
    asked again: the removed person went on receiving every change."""
    team = Team()
    first = _create(team)
    communicator = _communicator(f"/ws/runs/{first}/", _cookie(team, "viewer"))
    deleted, commit = threading.Event(), threading.Event()

    def remove_in_a_transaction() -> None:
        with transaction.atomic():
            _remove(team, "viewer")
            deleted.set()
            commit.wait(10)
        connection.close()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        connected, _ = await communicator.connect()
        assert connected
        remover = threading.Thread(target=remove_in_a_transaction)
        try:
            remover.start()
            await sync_to_async(deleted.wait)(10)
            realtime.publish([realtime.run_group(first)], _change(first))
            before_commit = await communicator.receive_json_from(timeout=5)
            commit.set()
            await sync_to_async(remover.join)(10)
            realtime.publish([realtime.run_group(first)], _change(first))
            after = await communicator.receive_output(timeout=5)
            return before_commit, after
        finally:
            commit.set()
            await communicator.disconnect()

    before_commit, after = async_to_sync(scenario)()
    assert before_commit["run"] == first, "uncommitted, the removal is not yet seen by anyone"
    assert after["type"] == "websocket.close" and after.get("code") == 4403, after


def _change(run_id: str) -> dict[str, Any]:
    return {"type": "run.changed", "run": run_id, "status": "running", "seq": 1, "attention": None, "tasks": []}


def test_it_keeps_pushing_to_members_and_asks_the_database_only_when_memberships_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runs import consumers

    team = Team()
    communicator = _communicator(f"/ws/workspaces/{team.slug}/", _cookie(team, "viewer"))
    checks: list[int] = []
    original = consumers.member_of

    def counting(user_id: Any, workspace_id: int) -> bool:
        checks.append(1)
        return original(user_id, workspace_id)

    monkeypatch.setattr(consumers, "member_of", counting)

    def role_changed() -> None:
        membership = Membership.objects.get(user=team.users["viewer"], workspace=team.workspace)
        membership.role = "reader"
        membership.save()

    async def scenario() -> list[str]:
        connected, _ = await communicator.connect()
        assert connected
        seen = []
        try:
            for _ in range(3):
                run_id = await sync_to_async(_create)(team)
                seen.append((await communicator.receive_json_from(timeout=5))["run"] == run_id)
            assert checks == []  # nothing changed: no database read per push
            await sync_to_async(role_changed)()
            run_id = await sync_to_async(_create)(team)
            seen.append((await communicator.receive_json_from(timeout=5))["run"] == run_id)
            return [str(s) for s in seen]
        finally:
            await communicator.disconnect()

    assert async_to_sync(scenario)() == ["True"] * 4
    assert checks == [1]
