"""Every committed run change is published to the run's group and the workspace's group."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from channels_redis import pubsub
from django.conf import settings

from oz0site import channel_layer, realtime
from oz0site.channel_layer import ConfirmedPubSubLayer
from runs import kernel
from tests.conftest import Team, wait_for
from tests.runs.driver import drive, echo, fail

pytestmark = pytest.mark.usefixtures("committed", "no_dispatch")


async def _next(layer: Any, channel: str, timeout: float = 5.0) -> dict[str, Any]:
    return await asyncio.wait_for(layer.receive(channel), timeout)


Await = Callable[[Coroutine[Any, Any, Any]], Any]


async def _cancel_the_rest() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def on_loop() -> Iterator[Await]:
    """One event loop for the whole test, as a web process has: the layer keeps its
    subscriptions per event loop, so each `async_to_sync` call on a loop of its own would
    subscribe anew and miss what the previous one was sent."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield lambda coroutine: asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=30)
    finally:
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_it_publishes_committed_changes_to_the_run_and_workspace_groups(on_loop: Await) -> None:
    team = Team()
    layer = get_channel_layer()
    run_channel = on_loop(layer.new_channel())
    ws_channel = on_loop(layer.new_channel())
    on_loop(layer.group_add(realtime.workspace_group(team.workspace.pk), ws_channel))
    run, _ = kernel.create_run(
        workspace=team.workspace,
        user=team.users["operator"],
        body={"tasks": [fail("a", on_failure="halt"), echo("b", after=["a"])], "deliverable": "b"},
    )
    first = on_loop(_next(layer, ws_channel))
    assert first["type"] == "run.changed" and first["run"] == str(run.pk) and first["seq"] >= 1
    on_loop(layer.group_add(realtime.run_group(run.pk), run_channel))
    drive(run)
    messages = []
    while True:
        try:
            messages.append(on_loop(_next(layer, run_channel, 2.0)))
        except TimeoutError:
            break
    assert messages, "no message reached the run's group"
    last = messages[-1]
    assert last["status"] == "needs_attention" and last["attention"] == "halt_failure"
    # Signals carry statuses, keys and reasons: never an agent's or a tool's words.
    assert all("failed" not in str(m.get("detail", "")) for m in messages)
    assert not any("a failed" in str(m) for m in messages)


def test_it_publishes_nothing_for_a_change_that_rolled_back(on_loop: Await) -> None:
    team = Team()
    layer = get_channel_layer()
    ws_channel = on_loop(layer.new_channel())
    on_loop(layer.group_add(realtime.workspace_group(team.workspace.pk), ws_channel))
    with pytest.raises(kernel.InvalidRequest):
        kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"tasks": [echo("a", after=["missing"])]})
    with pytest.raises(TimeoutError):
        on_loop(_next(layer, ws_channel, 1.0))


def test_a_change_published_right_after_group_add_reaches_the_new_member(on_loop: Await) -> None:
    """A wait subscribes before the read that decides to sleep, a page's socket after the page was
    read: both count on every change published after `group_add` returned reaching them, from
    any process. So `group_add` returns only once Redis holds the subscription."""
    layer = get_channel_layer()
    observer = redis.Redis.from_url(settings.REDIS_URL)
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    channel = on_loop(layer.new_channel())
    try:
        for attempt in range(100):
            run = f"joined-{uuid.uuid4().hex}"
            on_loop(layer.group_add(realtime.run_group(run), channel))
            subscribers = observer.pubsub_numsub(group_channel(prefix, realtime.run_group(run)))[0][1]
            assert subscribers == 1, f"attempt {attempt}: group_add returned before Redis held it"
            observer.publish(group_channel(prefix, realtime.run_group(run)), layer.serialize(_change(run, 1, "a")))
            assert on_loop(_next(layer, channel, 5.0))["run"] == run
            on_loop(layer.group_discard(realtime.run_group(run), channel))
    finally:
        observer.close()


class SlowRedis:
    """A TCP proxy to Redis that, once `hold` is set, holds the bytes of its first client (a
    layer's subscriber connection) that long, in order: a Redis that has not yet read a
    SUBSCRIBE already sent."""

    def __init__(self) -> None:
        self.hold = 0.0
        self.connections = 0
        self.held_writes = 0  # the first client's writes that reached Redis while `hold` was set

    async def close(self) -> None:
        # On the proxy's own loop: asyncio's Server is not thread-safe, and its connections
        # closing on the loop thread would race a close() from the test's thread.
        self.server.close()
        await self.server.wait_closed()

    async def start(self) -> str:
        upstream = urlsplit(settings.REDIS_URL)
        self.upstream = (upstream.hostname or "127.0.0.1", upstream.port or 6379)
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{upstream.path}"

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        subscriber = self.connections == 1
        redis_reader, redis_writer = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(self._pipe(client_reader, redis_writer, subscriber), self._pipe(redis_reader, client_writer, False))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, held: bool) -> None:
        try:
            while data := await reader.read(65536):
                if held and self.hold:
                    self.held_writes += 1
                    await asyncio.sleep(self.hold)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def group_channel(prefix: str, group: str) -> str:
    """The Redis pub/sub channel a layer publishes a group's messages on."""
    return f"{prefix}__group__{group}"


LayerBehind = Callable[[Any], tuple[Any, str, SlowRedis]]


@pytest.fixture
def layer_behind(on_loop: Await) -> Iterator[LayerBehind]:
    """A layer of the given class talking to Redis through a `SlowRedis` (closed after the test)."""
    made: list[tuple[Any, SlowRedis]] = []

    def make(layer_class: Any) -> tuple[Any, str, SlowRedis]:
        proxy = SlowRedis()
        prefix = f"confirm{uuid.uuid4().hex[:8]}"
        layer = layer_class(hosts=[{"address": on_loop(proxy.start())}], prefix=prefix)
        made.append((layer, proxy))
        return layer, prefix, proxy

    yield make
    for layer, proxy in made:
        on_loop(layer.flush())
        on_loop(proxy.close())


@pytest.mark.parametrize("confirmed", [True, False], ids=["oz0-layer", "unconfirmed-pubsub"])
def test_group_add_returns_only_once_redis_holds_the_subscription(
    on_loop: Await, layer_behind: LayerBehind, confirmed: bool
) -> None:
    """Behind a Redis slow to read its clients, oz0's layer still returns from `group_add` only
    once the subscription is in place; channels_redis's own pub/sub layer returns as soon as the
    SUBSCRIBE is sent, and a change published then is lost to the new member."""
    layer_class = ConfirmedPubSubLayer if confirmed else pubsub.RedisPubSubChannelLayer
    layer, prefix, proxy = layer_behind(layer_class)
    observer = redis.Redis.from_url(settings.REDIS_URL)
    try:
        for _ in range(3):
            proxy.hold = 0
            channel = on_loop(layer.new_channel())  # a receive that timed out takes its channel along
            proxy.hold = 0.05
            run = uuid.uuid4().hex
            redis_channel = group_channel(prefix, realtime.run_group(run))
            on_loop(layer.group_add(realtime.run_group(run), channel))
            assert observer.pubsub_numsub(redis_channel)[0][1] == (1 if confirmed else 0)
            observer.publish(redis_channel, layer.serialize(_change(run, 1, "a")))
            if confirmed:
                assert on_loop(_next(layer, channel, 5.0))["run"] == run
            else:
                with pytest.raises(TimeoutError):
                    on_loop(_next(layer, channel, 0.3))
    finally:
        observer.close()


def test_group_add_gives_up_on_a_confirmation_that_does_not_come(
    on_loop: Await, layer_behind: LayerBehind, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stuck subscriber connection costs a page or a wait a few seconds (then a warning, and the
    re-reads they fall back on), never a hang."""
    monkeypatch.setattr(channel_layer, "CONFIRM_GIVE_UP_SECONDS", 0.2)
    layer, prefix, proxy = layer_behind(ConfirmedPubSubLayer)
    observer = redis.Redis.from_url(settings.REDIS_URL)
    try:
        channel = on_loop(layer.new_channel())
        proxy.hold = 3.0
        redis_channel = group_channel(prefix, realtime.run_group("stuck"))
        with caplog.at_level(logging.WARNING, logger="oz0site.channel_layer"):
            on_loop(asyncio.wait_for(layer.group_add(realtime.run_group("stuck"), channel), 2.0))
        assert "did not confirm a subscription" in caplog.text
        assert observer.pubsub_numsub(redis_channel)[0][1] == 0  # still held on its way in
    finally:
        observer.close()


def test_a_group_this_process_holds_confirmed_is_joined_without_a_probe(
    on_loop: Await, layer_behind: LayerBehind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console page's sockets join the workspace's group one after another: only the first waits
    for Redis. Once the group's last socket leaves, the next join waits again, and returns only
    once the new subscription is in place; a confirmation that gave up marks nothing."""
    layer, prefix, proxy = layer_behind(ConfirmedPubSubLayer)
    probes: list[bool] = []
    confirm = channel_layer.ConfirmedLoopLayer._confirm

    async def counted(self: Any, shard: Any) -> bool:
        probes.append(await confirm(self, shard))
        return probes[-1]

    monkeypatch.setattr(channel_layer.ConfirmedLoopLayer, "_confirm", counted)
    observer = redis.Redis.from_url(settings.REDIS_URL)
    group = realtime.workspace_group(uuid.uuid4().int % 10**9)
    redis_channel = group_channel(prefix, group)
    try:
        first, second, third = (on_loop(layer.new_channel()) for _ in range(3))
        on_loop(layer.group_add(group, first))
        on_loop(layer.group_add(group, second))
        assert probes == [True]
        on_loop(layer.group_discard(group, second))
        on_loop(layer.group_add(group, second))
        assert probes == [True], "the group never left this process"
        on_loop(layer.group_discard(group, first))
        on_loop(layer.group_discard(group, second))
        assert observer.pubsub_numsub(redis_channel)[0][1] == 0
        proxy.hold = 0.05  # a Redis slow to read the new SUBSCRIBE
        on_loop(layer.group_add(group, third))
        assert probes == [True, True]
        assert observer.pubsub_numsub(redis_channel)[0][1] == 1
        observer.publish(redis_channel, layer.serialize(_change("r", 1, "a")))
        assert on_loop(_next(layer, third, 5.0))["run"] == "r"
        # A confirmation that gives up leaves the group unmarked: the next join asks again.
        other = realtime.workspace_group(uuid.uuid4().int % 10**9)
        monkeypatch.setattr(channel_layer, "CONFIRM_GIVE_UP_SECONDS", 0.1)
        proxy.hold = 1.0
        on_loop(layer.group_add(other, first))
        proxy.hold = 0
        wait_for(lambda: observer.pubsub_numsub(group_channel(prefix, other))[0][1] == 1, message="the late SUBSCRIBE")
        on_loop(layer.group_add(other, second))
        assert probes == [True, True, False, True]
    finally:
        observer.close()


@pytest.mark.parametrize("pipelined", [True, False], ids=["oz0-layer", "channels-redis-pubsub"])
def test_sends_made_while_a_publish_is_in_flight_go_together(on_loop: Await, layer_behind: LayerBehind, pipelined: bool) -> None:
    """A wave of changes costs the publisher a round trip or two, not one per message: the first
    send goes at once, the ones made meanwhile in one pipeline once it is answered. In order,
    every one of them."""
    layer_class = ConfirmedPubSubLayer if pipelined else pubsub.RedisPubSubChannelLayer
    layer, prefix, proxy = layer_behind(layer_class)
    listener = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    group = realtime.run_group(uuid.uuid4().hex)
    listener.subscribe(group_channel(prefix, group))
    try:
        on_loop(layer.group_send(group, _change("warm", 0, "a")))  # the connection's handshake, unheld
        proxy.hold = 0.05

        async def wave() -> None:
            await asyncio.gather(*(layer.group_send(group, _change("wave", seq, "a")) for seq in range(1, 51)))

        on_loop(wave())
        assert proxy.held_writes <= 2 if pipelined else proxy.held_writes == 50
        received: list[int] = []
        for _ in range(200):
            if len(received) == 51:
                break
            message = listener.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                received.append(layer.deserialize(message["data"])["seq"])
        assert received == list(range(51))
    finally:
        listener.close()


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


def _drain(on_loop: Await, layer: Any, channel: str, quiet: float = 1.0) -> list[dict[str, Any]]:
    messages = []
    while True:
        try:
            messages.append(on_loop(_next(layer, channel, quiet)))
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


def test_it_folds_a_burst_of_one_runs_changes_into_its_last_push(monkeypatch: pytest.MonkeyPatch, on_loop: Await) -> None:
    """A run changing hundreds of times a second (a fan of quick calls) costs at most one push per
    window; the push that ends the window carries the latest seq and every task the burst named."""
    monkeypatch.setattr(realtime, "COALESCE_SECONDS", 0.3)
    layer = get_channel_layer()
    channel = on_loop(layer.new_channel())
    group = realtime.run_group("burst")
    on_loop(layer.group_add(group, channel))
    for seq in range(1, 41):
        realtime.publish([group], _change("burst", seq, f"t{seq % 5}"))
    messages = _drain(on_loop, layer, channel)
    # The first change at once, the other 39 folded into the push at the end of its window.
    assert [m["seq"] for m in messages] == [1, 40]
    assert sorted(messages[-1]["tasks"]) == ["t0", "t1", "t2", "t3", "t4"]


def test_a_busy_run_does_not_delay_another_runs_push(monkeypatch: pytest.MonkeyPatch, on_loop: Await) -> None:
    monkeypatch.setattr(realtime, "COALESCE_SECONDS", 0.5)
    layer = get_channel_layer()
    channel = on_loop(layer.new_channel())
    for run in ("busy", "quiet"):
        on_loop(layer.group_add(realtime.run_group(run), channel))
    realtime.publish([realtime.run_group("busy")], _change("busy", 1, "a"))
    realtime.publish([realtime.run_group("busy")], _change("busy", 2, "a"))  # waits for the window's end
    realtime.publish([realtime.run_group("quiet")], _change("quiet", 7, "q"))
    messages = [(m["run"], m["seq"]) for m in _drain(on_loop, layer, channel)]
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


def test_a_workspaces_runs_changing_at_once_cost_its_sockets_one_push_per_window(
    monkeypatch: pytest.MonkeyPatch, on_loop: Await
) -> None:
    """A busy workspace (hundreds of runs changing) pushes its workspace sockets the first change
    at once and one folded push at the end of the window, naming the runs that changed; the runs'
    own sockets still hear each run, and another workspace's push does not wait for the window."""
    monkeypatch.setattr(realtime, "WORKSPACE_COALESCE_SECONDS", 0.4)
    layer = get_channel_layer()
    busy_ws, run_sockets, quiet_ws = (on_loop(layer.new_channel()) for _ in range(3))
    on_loop(layer.group_add(realtime.workspace_group(1), busy_ws))
    on_loop(layer.group_add(realtime.workspace_group(2), quiet_ws))
    for number in range(30):
        on_loop(layer.group_add(realtime.run_group(f"r{number}"), run_sockets))
    for number in range(30):
        change = _change(f"r{number}", number + 1, "t")
        realtime.publish([realtime.run_group(f"r{number}"), realtime.workspace_group(1)], change)
    realtime.publish([realtime.workspace_group(2)], {**_change("quiet", 3, "q"), "workspace": 2})
    quiet = _drain(on_loop, layer, quiet_ws, quiet=0.2)
    busy = _drain(on_loop, layer, busy_ws)
    assert [m["run"] for m in quiet] == ["quiet"]
    assert [m["run"] for m in busy] == ["r0", "r29"]
    assert busy[-1]["runs"] == [f"r{n}" for n in range(1, 30)] and "tasks" not in busy[-1]
    assert sorted(m["run"] for m in _drain(on_loop, layer, run_sockets, quiet=0.3)) == sorted(f"r{n}" for n in range(30))


def test_folding_one_runs_changes_in_a_workspace_keeps_its_tasks() -> None:
    one = realtime.fold_runs(_change("r", 4, "a"), _change("r", 9, "b"))
    assert one["seq"] == 9 and set(one["tasks"]) == {"a", "b"} and "runs" not in one
    many = realtime.fold_runs(realtime.fold_runs(_change("r", 4, "a"), _change("s", 2, "b")), _change("r", 5, "c"))
    assert many["run"] == "r" and many["runs"] == ["r", "s"] and "tasks" not in many
    capped = {"runs": [f"x{i}" for i in range(60)], **_change("y", 1, "t")}
    assert len(realtime.fold_runs(capped, _change("z", 1, "t"))["runs"]) == realtime.RUNS_NAMED_AT_MOST


def test_a_group_that_stays_busy_is_pushed_once_per_busy_window_and_at_once_when_it_calms(
    monkeypatch: pytest.MonkeyPatch, on_loop: Await
) -> None:
    """Before, a workspace whose runs changed without pause cost each of its sockets a push every
    window (ten a second): 200 sockets of one noisy workspace took another's pushes from 10 ms to
    300 ms. A group folding change after change now doubles its window up to the busy window."""
    monkeypatch.setattr(realtime, "COALESCE_SECONDS", 0.05)
    monkeypatch.setattr(realtime, "BUSY_WINDOW_SECONDS", 0.4)
    layer = get_channel_layer()
    channel = on_loop(layer.new_channel())
    group = realtime.run_group("steady")
    on_loop(layer.group_add(group, channel))
    seq = 0
    ends_at = time.monotonic() + 2.0
    while time.monotonic() < ends_at:  # a change every 10 ms for two seconds
        seq += 1
        realtime.publish([group], _change("steady", seq, "t"))
        time.sleep(0.01)
    messages = _drain(on_loop, layer, channel)
    # At a fixed 50 ms window this is about 40 pushes; growing (50, 100, 200, 400 ms...) about 8.
    assert len(messages) <= 12, [m["seq"] for m in messages]
    assert messages[-1]["seq"] == seq  # nothing folded away
    assert realtime._window_of(group) == 0.4
    # Calm again: the next change finds its window passed and the window back at its base. (A
    # drain that timed out left its channel: the layer unsubscribes a canceled receive.)
    calm = on_loop(layer.new_channel())
    on_loop(layer.group_add(group, calm))
    realtime.publish([group], _change("steady", seq + 1, "t")).result(timeout=5)  # type: ignore[union-attr]
    assert [m["seq"] for m in _drain(on_loop, layer, calm, quiet=0.3)] == [seq + 1]
    assert realtime._window_of(group) == 0.05


class _Codec:
    def serialize(self, message: dict[str, Any]) -> bytes:
        return json.dumps(message).encode()

    def deserialize(self, data: bytes) -> dict[str, Any]:
        return dict(json.loads(data))


class _Layer:
    """What a shard connection reads of its loop's layer: the channels' queues, the groups, the codec."""

    prefix = ""
    channel_layer = _Codec()

    def __init__(self) -> None:
        self.channels: dict[str, asyncio.Queue[bytes]] = {}
        self.groups: dict[str, set[str]] = {}


def test_a_big_groups_fan_out_lets_another_groups_message_through() -> None:
    """A busy workspace's wave to its many sockets was handed to all of them in one step: a quiet
    workspace's push that arrived a moment later waited behind every one of them."""

    async def scenario() -> None:
        layer = _Layer()
        big = [f"specific.big{i}" for i in range(100)]
        layer.channels = {name: asyncio.Queue() for name in [*big, "specific.quiet"]}
        layer.groups = {"run.busy": set(big), "run.quiet": {"specific.quiet"}}
        shard = channel_layer.PacedShardConnection({"address": "redis://127.0.0.1:1"}, layer)
        shard._receive_message({"channel": b"run.busy", "data": b"wave 1"})
        shard._receive_message({"channel": b"run.busy", "data": b"wave 2"})
        shard._receive_message({"channel": "run.quiet", "data": b"mine"})
        assert layer.channels["specific.quiet"].qsize() == 1
        handed = sum(layer.channels[name].qsize() for name in big)
        assert handed <= 2 * channel_layer.fan_out_slice(), handed
        for _ in range(50):
            await asyncio.sleep(0)
        # Every socket of the busy group gets each wave once, in order.
        for name in big:
            queue = layer.channels[name]
            assert [queue.get_nowait() for _ in range(queue.qsize())] == [b"wave 1", b"wave 2"], name

    asyncio.run(scenario())


def test_a_workspaces_pushes_to_its_sockets_are_bounded_by_their_number(settings: Any) -> None:
    """Every worker process folds a workspace's changes on its own, so a busy workspace's 200 sockets
    were each pushed several times a second, most of a web process's event loop. Here a workspace
    group's messages reach its sockets at most once per (sockets / budget) seconds, folded."""
    settings.OZ0_WORKSPACE_PUSHES_PER_SECOND = 100  # 50 sockets: one message each per 0.5 s

    def change(run: str, seq: int) -> bytes:
        return json.dumps({"type": "run.changed", "run": run, "seq": seq, "status": "running"}).encode()

    def drained(queue: asyncio.Queue[bytes]) -> list[dict[str, Any]]:
        return [json.loads(queue.get_nowait()) for _ in range(queue.qsize())]

    async def scenario() -> None:
        layer = _Layer()
        busy = [f"specific.busy{i}" for i in range(50)]
        layer.channels = {name: asyncio.Queue() for name in [*busy, "specific.quiet"]}
        layer.groups = {"__group__ws.1": set(busy), "__group__ws.2": {"specific.quiet"}}
        shard = channel_layer.PacedShardConnection({"address": "redis://127.0.0.1:1"}, layer)
        shard._receive_message({"channel": "__group__ws.1", "data": change("a", 1)})
        shard._receive_message({"channel": "__group__ws.1", "data": change("b", 2)})
        shard._receive_message({"channel": "__group__ws.1", "data": change("a", 3)})
        shard._receive_message({"channel": "__group__ws.2", "data": change("q", 1)})
        for _ in range(10):
            await asyncio.sleep(0)
        # The first change at once; the quiet workspace's at once, beside a held busy one.
        assert [m["seq"] for m in drained(layer.channels["specific.quiet"])] == [1]
        assert all([m["seq"] for m in drained(layer.channels[name])] == [1] for name in busy)
        await asyncio.sleep(0.3)
        assert all(layer.channels[name].empty() for name in busy), "pushed again within the window"
        await asyncio.sleep(0.4)
        for name in busy:
            (folded,) = drained(layer.channels[name])
            assert folded["seq"] == 3 and folded["runs"] == ["b", "a"], folded

    asyncio.run(scenario())


def test_a_workspace_groups_push_marks_its_workspace_quiet_for_the_web_share() -> None:
    """The web share lets a quiet workspace's push go first (oz0site/web_share.py): the layer says
    which workspace a push is handed to; a run group's names none."""
    from oz0site import web_share

    async def scenario() -> None:
        layer = _Layer()
        layer.channels = {"specific.a": asyncio.Queue(), "specific.b": asyncio.Queue()}
        layer.groups = {"__group__ws.41": {"specific.a"}, "run.r": {"specific.b"}}
        shard = channel_layer.PacedShardConnection({"address": "redis://127.0.0.1:1"}, layer)
        web_share._quiet_pushes.clear()
        shard._receive_message({"channel": "run.r", "data": b"{}"})
        assert web_share._quiet_pushes == {}
        shard._receive_message({"channel": "__group__ws.41", "data": b"{}"})
        assert list(web_share._quiet_pushes) == [41]
        assert layer.channels["specific.a"].qsize() == 1

    asyncio.run(scenario())
