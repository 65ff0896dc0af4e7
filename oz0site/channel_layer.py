"""The channel layer: Redis pub/sub, a `group_add` that returns once Redis holds it, pipelined sends.

Why pub/sub: channels_redis's list-based layer hands a process its messages one at a time,
each through four Redis round trips under a lock the whole process shares, so a wave of 100
runs changing at once reached the hundredth socket of a web process hundreds of milliseconds
late (more while that process also served a fan's appends). With pub/sub, Redis pushes every
message of a group to every subscribed process over one connection, and a publish is one
PUBLISH. What pub/sub gives up (a message for a process that is not subscribed at that moment
is dropped, not kept for a minute) costs nothing here: every receiver re-reads what it shows.

Why the confirmation: redis-py sends SUBSCRIBE without waiting for its answer, so a change
published right after `group_add` returned could still miss the new subscriber. A wait
subscribes *before* the read that decides to sleep (runs.waits) and a page's socket after
the page was read: both rely on every change committed after `group_add` returns reaching
them. Redis runs one connection's commands in order, so once a probe channel subscribed after
the group on the same connection counts a subscriber, the group's subscription is in place.
A group this process already holds confirmed (another socket on the same workspace) needs
no probe: the mark lasts until the group's last channel leaves it.

Why the pipeline: channels_redis publishes one message per round trip under a lock its
connection shares, so a wave of 100 changes (200 group sends: the run's and the workspace's)
left its last message ~40 ms after its first. Sends that arrive while a publish is in flight
wait for the next one and go together: the first goes at once, the rest in one round trip.

Why the paced fan-out: a group message reaches every socket of this process in the group at
once, and channels_redis hands it to all of them in one step, so a busy workspace's wave to its
200 sockets put 200 consumers on the event loop ahead of any message that came a moment later:
a quiet workspace's push waited for the whole wave (tens of milliseconds, each wave). A group's
channels are now handed the message `OZ0_SOCKET_FAN_OUT_SLICE` at a time, one slice per turn of the loop;
a message for another group (or channel) that arrives meanwhile is handed on at once, so it
waits for at most a slice, not for the neighbour's whole wave.

Why a workspace's pushes have a budget here: the publishers fold a workspace's changes per
process, but every worker process publishes its own folds, so a workspace whose runs change
without pause reached each of its sockets several times a second, and what that costs the web
process grows with its sockets (200 sockets, four publishers: 800 socket messages a second, most
of a core's event loop). A workspace group's messages are handed on in this process at most once
per `sockets / OZ0_WORKSPACE_PUSHES_PER_SECOND` seconds; the changes that arrive within that
window are folded (oz0site.realtime.fold_runs: the latest change naming every run that changed)
into one message at its end. A quiet workspace's first change in a while still goes at once.

Why a workspace's push is told to the web share: the event loop's part of a push (the membership
stamp, the frames) needs the interpreter that busy workspaces' requests hold; a push of a quiet
workspace (one whose requests kept little of this process lately) goes first as its requests do
(oz0site/web_share.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from channels_redis import pubsub
from django.conf import settings

from oz0site import web_share

CONFIRM_POLL_SECONDS = 0.001
# Past this the subscription is left to land on its own: a socket or a wait that gave up here
# would only fall back on re-reading, as a late subscription does.
CONFIRM_GIVE_UP_SECONDS = 5.0

log = logging.getLogger(__name__)


FORGET_AFTER = 4096


class PacedShardConnection(pubsub.RedisSingleShardConnection):
    """One Redis host's subscriptions, handing a group's message to its channels a slice per loop
    turn, and a workspace group's at most once per its window."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per workspace group: when its last message was handed on, and the fold waiting for its window's end.
        self._handed_at: dict[str, float] = {}
        self._held: dict[str, bytes] = {}

    def _receive_message(self, message: Any) -> None:
        if message is None:
            return
        name = message["channel"]
        if isinstance(name, bytes):
            name = name.decode()
        layer = self.channel_layer
        members = layer.groups.get(name) if name not in layer.channels else None
        if not members:
            super()._receive_message(message)
            return
        if self._workspace_of(name) is not None and self._hold(name, message["data"], len(members)):
            return
        self._fan_out(name, message["data"])

    def _workspace_of(self, name: str) -> int | None:
        """The workspace whose group the channel name is, or None (a run's group, a channel)."""
        workspace = name.removeprefix(f"{self.channel_layer.prefix}__group__ws.")
        return int(workspace) if workspace != name and workspace.isdigit() else None

    def _fan_out(self, name: str, data: bytes) -> None:
        members = self.channel_layer.groups.get(name)
        if not members:
            return
        workspace = self._workspace_of(name)
        if workspace is not None:
            web_share.push_is_quiet(workspace)
        size = fan_out_slice()
        if size <= 0 or len(members) <= size:
            super()._receive_message({"channel": name, "data": data})
            return
        self._hand_on(data, sorted(members), size)

    def _hold(self, name: str, data: bytes, sockets: int) -> bool:
        """True when the message waits (folded) for the end of its workspace's window."""
        budget = float(getattr(settings, "OZ0_WORKSPACE_PUSHES_PER_SECOND", 0) or 0)
        if budget <= 0:
            return False
        loop = asyncio.get_running_loop()
        if name in self._held:
            self._held[name] = self._fold(self._held[name], data)
            return True
        window, now = sockets / budget, loop.time()
        last = self._handed_at.get(name)
        if last is None or now - last >= window:
            self._handed_at[name] = now
            if len(self._handed_at) > FORGET_AFTER:
                self._handed_at = {k: at for k, at in self._handed_at.items() if now - at < 60}
            return False
        self._held[name] = data
        loop.call_later(last + window - now, self._release, name)
        return True

    def _release(self, name: str) -> None:
        data = self._held.pop(name, None)
        if data is None:
            return
        self._handed_at[name] = asyncio.get_running_loop().time()
        self._fan_out(name, data)

    def _fold(self, earlier: bytes, later: bytes) -> bytes:
        from oz0site.realtime import fold_runs

        codec = self.channel_layer.channel_layer
        first, second = codec.deserialize(earlier), codec.deserialize(later)
        if first.get("type") != "run.changed" or second.get("type") != "run.changed":
            return later  # every receiver re-reads what it shows: the latest message tells it
        return bytes(codec.serialize(fold_runs(first, second)))

    def _hand_on(self, data: bytes, channels: list[str], size: int) -> None:
        queues = self.channel_layer.channels
        for channel in channels[:size]:
            queue = queues.get(channel)
            if queue is not None:
                queue.put_nowait(data)
        if len(channels) > size:
            # The next slice on the loop's next turn: whatever became ready meanwhile goes first.
            asyncio.get_running_loop().call_soon(self._hand_on, data, channels[size:], size)


def fan_out_slice() -> int:
    return int(getattr(settings, "OZ0_SOCKET_FAN_OUT_SLICE", 16))


class ConfirmedLoopLayer(pubsub.RedisPubSubLoopLayer):
    """One event loop's side of the layer (channels_redis keeps one per loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # channels_redis made one plain connection per host: the same hosts, paced.
        self._shards = [
            PacedShardConnection(host, self) for host in pubsub.decode_hosts(kwargs.get("hosts", args[0] if args else None))
        ]
        # Per shard (one per Redis host): the sends waiting for the publish in flight, and its task.
        self._outbox: dict[Any, list[tuple[str, bytes, asyncio.Future[None]]]] = {}
        self._publishing: dict[Any, asyncio.Task[None]] = {}
        # The groups whose subscription Redis confirmed, until this process leaves them.
        self._confirmed: set[str] = set()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        channel = self._get_group_channel_name(group)
        await self._publish(channel, self.channel_layer.serialize(message))

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        await self._publish(channel, self.channel_layer.serialize(message))

    async def _publish(self, channel: str, data: bytes) -> None:
        shard = self._get_shard(channel)
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.setdefault(shard, []).append((channel, data, sent))
        publisher = self._publishing.get(shard)
        if publisher is None or publisher.done():
            self._publishing[shard] = asyncio.ensure_future(self._publish_waiting(shard))
        await sent

    async def _publish_waiting(self, shard: Any) -> None:
        while batch := self._outbox.pop(shard, []):
            try:
                async with shard._lock:
                    shard._ensure_redis()
                    pipeline = shard._redis.pipeline(transaction=False)
                    for channel, data, _ in batch:
                        pipeline.publish(channel, data)
                    await pipeline.execute()
            except Exception as error:  # each sender hears of its own failure, as from a lone publish
                for _, _, sent in batch:
                    if not sent.done():
                        sent.set_exception(error)
                continue
            for _, _, sent in batch:
                if not sent.done():
                    sent.set_result(None)

    async def group_add(self, group: str, channel: str) -> None:
        group_channel = self._get_group_channel_name(group)
        await super().group_add(group, channel)
        if group_channel in self._confirmed:
            return  # another socket of this process joined it before: Redis already delivers it here
        if await self._confirm(self._get_shard(group_channel)):
            self._confirmed.add(group_channel)

    async def group_discard(self, group: str, channel: str) -> None:
        group_channel = self._get_group_channel_name(group)
        if self.groups.get(group_channel) == {channel}:
            # Forgotten before the unsubscribe is sent: a join meanwhile confirms afresh.
            self._confirmed.discard(group_channel)
        await super().group_discard(group, channel)

    async def flush(self) -> None:
        self._confirmed.clear()
        await super().flush()

    async def _confirm(self, shard: Any) -> bool:
        """Wait until Redis holds this shard's subscriptions made so far; False if it gave up."""
        probe = f"{self.prefix}__probe__{uuid.uuid4().hex}"
        await shard.subscribe(probe)
        give_up_at = asyncio.get_running_loop().time() + CONFIRM_GIVE_UP_SECONDS
        try:
            while not (await shard._redis.pubsub_numsub(probe))[0][1]:
                if asyncio.get_running_loop().time() > give_up_at:
                    log.warning("channel layer: Redis did not confirm a subscription in %ss", CONFIRM_GIVE_UP_SECONDS)
                    return False
                await asyncio.sleep(CONFIRM_POLL_SECONDS)
            return True
        finally:
            await shard.unsubscribe(probe)


class ConfirmedPubSubLayer(pubsub.RedisPubSubChannelLayer):
    def _get_layer(self) -> ConfirmedLoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = ConfirmedLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            pubsub._wrap_close(self, loop)
        return layer
