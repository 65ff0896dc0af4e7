"""Live pushes: one consumer per run and per workspace, members only.

The kernel publishes `run.changed` to both groups after commit; consumers forward a
small signal (status, seq, attention reason: no words) that makes the page fetch the
fragment it shows. Membership is checked again before every push: a person removed from the
workspace (or deactivated) gets nothing more, and the socket closes.

Each push is handled on its own: an error while one socket checks or sends (Redis away, the
database slow) is logged and skips that socket's push; it never closes the socket, nor any other.
A socket holds a lease under the per-user and per-session caps, and closes when its session
signs out (oz0site/sockets.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from oz0site import sockets
from oz0site.realtime import run_group, workspace_group
from oz0site.sockets import database_call
from runs.models import Run
from tenancy import membership
from tenancy.models import Membership, Workspace
from tenancy.permissions import role_of

log = logging.getLogger(__name__)

# Close code for a socket whose person is no longer a member.
CLOSE_NOT_A_MEMBER = 4403


def member_of(user_id: Any, workspace_id: int) -> bool:
    """A fresh read (no per-user cache): is the active user still a member of the workspace?"""
    return Membership.objects.filter(user_id=user_id, user__is_active=True, workspace_id=workspace_id).exists()


class _MemberConsumer(AsyncJsonWebsocketConsumer):
    group: str = ""
    session_group: str = ""
    workspace_id: int | None = None
    stamp: str | None = None
    lease: tuple[Any, str] | None = None
    renewer: asyncio.Task[None] | None = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels closes stale database connections before every handler, through the process's
        one thread for thread-sensitive calls: a push wave to a neighbour's 180 sockets queued 180
        hops on it (each waiting for the GIL behind the request threads), and a quiet workspace's
        push waited behind them all. These handlers touch the database only through
        `database_call` (oz0site.sockets), which closes stale connections in its own call; the event
        loop's thread holds none."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def _join(self, group: str | None) -> None:
        if group is None:
            await self.close(code=4404)
            return
        user, session = self.scope["user"], self.scope.get("session")
        session_key = getattr(session, "session_key", None) or ""
        if not session_key:
            await self.close(code=4404)
            return
        refused = await sockets.take_lease(self.channel_name, user.pk, session_key)
        if refused:
            # Accepted, then closed: the client reads why (a refused handshake says nothing).
            await self.accept()
            await self.close(code=sockets.CLOSE_TOO_MANY)
            return
        self.lease = (user.pk, session_key)
        self.renewer = asyncio.get_running_loop().create_task(self._renew())
        self.group = group
        self.session_group = sockets.session_group(session_key)
        await self.channel_layer.group_add(group, self.channel_name)
        await self.channel_layer.group_add(self.session_group, self.channel_name)
        await self.accept()

    async def _renew(self) -> None:
        while self.lease is not None:
            await asyncio.sleep(sockets.RENEW_SECONDS)
            try:
                await sockets.renew_lease(self.channel_name, *self.lease)
            except Exception:  # a missed renewal only shortens the lease; the next one tries again
                log.warning("socket lease renewal failed", exc_info=True)

    async def _stamp(self, wave: str | None = None) -> str | None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        return await membership.stamp_in_wave(user.pk, wave)

    async def _is_member(self) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or self.workspace_id is None:
            return False
        return bool(await database_call(member_of)(user.pk, self.workspace_id))

    async def _still_member(self, wave: str | None) -> bool:
        """The stamp moves on every membership change: only then is the database asked again.

        Without a stamp (Redis unreachable or slow) the database answers, and the stamp is
        forgotten so the next push compares afresh.
        """
        try:
            stamp = await self._stamp(wave)
        except Exception:
            log.warning("membership stamp unreadable: asking the database", exc_info=True)
            self.stamp = None
            return await self._is_member()
        if stamp == self.stamp:
            return True
        member = await self._is_member()
        self.stamp = stamp
        return member

    async def disconnect(self, code: int) -> None:
        lease, self.lease = self.lease, None
        if self.renewer is not None:
            self.renewer.cancel()
            self.renewer = None
        for name in (self.group, self.session_group):
            if name:
                with contextlib.suppress(Exception):
                    await self.channel_layer.group_discard(name, self.channel_name)
        self.group = self.session_group = ""
        if lease is not None:
            try:
                await sockets.drop_lease(self.channel_name, *lease)
            except Exception:  # the lease ends by itself
                log.warning("socket lease not dropped", exc_info=True)

    async def _close_with(self, code: int) -> None:
        await self.disconnect(code)
        await self.close(code=code)

    async def run_changed(self, event: dict[str, Any]) -> None:
        try:
            if not await self._still_member(event.get("wave")):
                await self._close_with(CLOSE_NOT_A_MEMBER)
                return
            await self.send_json({k: v for k, v in event.items() if k not in ("type", "wave")} | {"type": "run.changed"})
        except Exception:
            # This socket misses this push; it and every other socket stay open.
            log.warning("live push to one socket failed", exc_info=True)

    async def session_ended(self, event: dict[str, Any]) -> None:
        await self._close_with(sockets.CLOSE_SIGNED_OUT)


class RunConsumer(_MemberConsumer):
    async def connect(self) -> None:
        self.stamp = await self._stamp()
        await self._join(await self._group())

    @database_call
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

    @database_call
    def _group(self) -> str | None:
        user = self.scope.get("user")
        workspace = Workspace.objects.filter(slug=self.scope["url_route"]["kwargs"]["slug"]).first()
        if workspace is None or role_of(user, workspace.pk) is None:
            return None
        self.workspace_id = workspace.pk
        return workspace_group(workspace.pk)
