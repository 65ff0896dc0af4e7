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
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from channels_redis import pubsub

CONFIRM_POLL_SECONDS = 0.001
# Past this the subscription is left to land on its own: a socket or a wait that gave up here
# would only fall back on re-reading, as a late subscription does.
CONFIRM_GIVE_UP_SECONDS = 5.0

log = logging.getLogger(__name__)


class ConfirmedLoopLayer(pubsub.RedisPubSubLoopLayer):
    """One event loop's side of the layer (channels_redis keeps one per loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
