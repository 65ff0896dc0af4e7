"""Live pushes: one consumer per run and per workspace, members only.

The kernel publishes `run.changed` to both groups after commit; consumers forward a
small signal (status, seq, attention reason: no words) that makes the page fetch the
fragment it shows. Membership is checked again before every push: a person removed from the
workspace (or deactivated) gets nothing more, and the socket closes.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from oz0site.realtime import run_group, workspace_group
from runs import membership
from runs.models import Membership, Run, Workspace
from runs.permissions import role_of

# Close code for a socket whose person is no longer a member.
CLOSE_NOT_A_MEMBER = 4403


def member_of(user_id: Any, workspace_id: int) -> bool:
    """A fresh read (no per-user cache): is the active user still a member of the workspace?"""
    return Membership.objects.filter(user_id=user_id, user__is_active=True, workspace_id=workspace_id).exists()


class _MemberConsumer(AsyncJsonWebsocketConsumer):
    group: str = ""
    workspace_id: int | None = None
    stamp: str | None = None

    async def _join(self, group: str | None) -> None:
        if group is None:
            await self.close(code=4404)
            return
        self.group = group
        await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def _stamp(self) -> str | None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        return await membership.current_stamp_async(user.pk)

    async def _is_member(self) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or self.workspace_id is None:
            return False
        return bool(await database_sync_to_async(member_of)(user.pk, self.workspace_id))

    async def _still_member(self) -> bool:
        """The stamp moves on every membership change: only then is the database asked again."""
        stamp = await self._stamp()
        if stamp == self.stamp:
            return True
        member = await self._is_member()
        self.stamp = stamp
        return member

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = ""

    async def run_changed(self, event: dict[str, Any]) -> None:
        if not await self._still_member():
            await self.disconnect(CLOSE_NOT_A_MEMBER)
            await self.close(code=CLOSE_NOT_A_MEMBER)
            return
        await self.send_json({k: v for k, v in event.items() if k != "type"} | {"type": "run.changed"})


class RunConsumer(_MemberConsumer):
    async def connect(self) -> None:
        self.stamp = await self._stamp()
        await self._join(await self._group())

    @database_sync_to_async
    def _group(self) -> str | None:
        user = self.scope.get("user")
        run = Run.objects.filter(pk=self.scope["url_route"]["kwargs"]["run_id"]).only("id", "workspace_id").first()
        if run is None or role_of(user, run.workspace_id) is None:
            return None
        self.workspace_id = run.workspace_id
        return run_group(run.id)


class WorkspaceConsumer(_MemberConsumer):
    async def connect(self) -> None:
        self.stamp = await self._stamp()
        await self._join(await self._group())

    @database_sync_to_async
    def _group(self) -> str | None:
        user = self.scope.get("user")
        workspace = Workspace.objects.filter(slug=self.scope["url_route"]["kwargs"]["slug"]).first()
        if workspace is None or role_of(user, workspace.pk) is None:
            return None
        self.workspace_id = workspace.pk
        return workspace_group(workspace.pk)
