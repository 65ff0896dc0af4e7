"""Live pushes: one consumer per run and per workspace, members only.

The kernel publishes `run.changed` to both groups after commit; consumers forward a
small signal (status, seq, attention reason: no words) that makes the page fetch the
fragment it shows.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from oz0site.realtime import run_group, workspace_group
from runs.models import Run, Workspace
from runs.permissions import role_of


class _MemberConsumer(AsyncJsonWebsocketConsumer):
    group: str = ""

    async def _join(self, group: str | None) -> None:
        if group is None:
            await self.close(code=4404)
            return
        self.group = group
        await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in event.items() if k != "type"} | {"type": "run.changed"})


class RunConsumer(_MemberConsumer):
    async def connect(self) -> None:
        await self._join(await self._group())

    @database_sync_to_async
    def _group(self) -> str | None:
        user = self.scope.get("user")
        run = Run.objects.filter(pk=self.scope["url_route"]["kwargs"]["run_id"]).only("id", "workspace_id").first()
        if run is None or role_of(user, run.workspace_id) is None:
            return None
        return run_group(run.id)


class WorkspaceConsumer(_MemberConsumer):
    async def connect(self) -> None:
        await self._join(await self._group())

    @database_sync_to_async
    def _group(self) -> str | None:
        user = self.scope.get("user")
        workspace = Workspace.objects.filter(slug=self.scope["url_route"]["kwargs"]["slug"]).first()
        if workspace is None or role_of(user, workspace.pk) is None:
            return None
        return workspace_group(workspace.pk)
