"""One person's sockets cannot close anyone else's (issue 27 item 2): a Redis pool that waits, one
stamp read per user per push wave, errors kept to their socket, caps per user and per session,
signed-out sessions closed, and an Origin check that compares the port."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from redis.exceptions import MaxConnectionsError

from oz0site import realtime, sockets
from tenancy import membership
from tests.conftest import Team

pytestmark = pytest.mark.usefixtures("committed", "no_dispatch")


def _client(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def _cookie(client: Client) -> str:
    return f"sessionid={client.cookies['sessionid'].value}"


def _socket(path: str, cookie: str, origin: bytes = b"http://localhost", host: bytes = b"localhost") -> WebsocketCommunicator:
    from oz0site.asgi import application

    return WebsocketCommunicator(application, path, headers=[(b"cookie", cookie.encode()), (b"origin", origin), (b"host", host)])


def _change(team: Team) -> dict[str, Any]:
    return {"type": "run.changed", "run": "r", "workspace": team.workspace.pk, "status": "running", "seq": 1, "tasks": []}


def _push(team: Team) -> None:
    realtime.publish([realtime.workspace_group(team.workspace.pk)], _change(team))


async def _open(communicators: list[WebsocketCommunicator]) -> list[Any]:
    return [await c.connect() for c in communicators]


async def _close(communicators: list[WebsocketCommunicator]) -> None:
    for communicator in communicators:
        await communicator.disconnect()


def test_a_burst_of_stamp_reads_larger_than_the_pool_waits_for_a_connection(settings: Any) -> None:
    """Before, the pool raised MaxConnectionsError past 100 reads at once, and every socket reading closed with 1011."""
    settings.OZ0_SOCKET_REDIS_CONNECTIONS = 4

    async def burst() -> list[str | None]:
        return await asyncio.gather(*(membership.current_stamp_async(f"burst-{i}") for i in range(300)))

    assert asyncio.run(burst()) == [None] * 300


def test_a_push_wave_reads_each_users_stamp_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, every socket read the stamp itself: 300 sockets of one viewer, 300 reads per push."""
    team = Team()
    cookie = _cookie(_client(team, "viewer"))
    communicators = [_socket(f"/ws/workspaces/{team.slug}/", cookie) for _ in range(5)]
    reads: list[Any] = []
    original = membership.current_stamp_async

    async def counting(user_id: Any) -> str | None:
        reads.append(user_id)
        return await original(user_id)

    async def scenario() -> list[str]:
        try:
            assert all(ok for ok, _ in await _open(communicators))
            monkeypatch.setattr(membership, "current_stamp_async", counting)
            _push(team)
            return [(await c.receive_json_from(timeout=5))["type"] for c in communicators]
        finally:
            await _close(communicators)

    assert async_to_sync(scenario)() == ["run.changed"] * 5
    assert reads == [team.users["viewer"].pk]


def test_a_socket_whose_checks_fail_stays_open_and_so_do_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a stamp read that raised (the pool empty) closed that socket with 1011, on every workspace."""
    team = Team()
    viewer = _socket(f"/ws/workspaces/{team.slug}/", _cookie(_client(team, "viewer")))
    operator = _socket(f"/ws/workspaces/{team.slug}/", _cookie(_client(team, "operator")))
    viewer_id = team.users["viewer"].pk
    original = membership.current_stamp_async
    database_down = [False]

    async def failing(user_id: Any) -> str | None:
        if user_id == viewer_id:
            raise MaxConnectionsError("Too many connections")
        return await original(user_id)

    from runs import consumers

    real_member_of = consumers.member_of

    def member_of(user_id: Any, workspace_id: int) -> bool:
        if database_down[0] and user_id == viewer_id:
            raise RuntimeError("database away")
        return real_member_of(user_id, workspace_id)

    async def scenario() -> list[Any]:
        try:
            assert all(ok for ok, _ in await _open([viewer, operator]))
            monkeypatch.setattr(membership, "current_stamp_async", failing)
            monkeypatch.setattr(consumers, "member_of", member_of)
            _push(team)
            seen = [(await viewer.receive_json_from(timeout=5))["type"], (await operator.receive_json_from(timeout=5))["type"]]
            database_down[0] = True  # neither Redis nor the database answers for the viewer: a push missed
            _push(team)
            seen.append((await operator.receive_json_from(timeout=5))["type"])
            seen.append(await viewer.receive_nothing(timeout=1))
            database_down[0] = False
            _push(team)
            seen += [(await viewer.receive_json_from(timeout=5))["type"], (await operator.receive_json_from(timeout=5))["type"]]
            return seen
        finally:
            await _close([viewer, operator])

    assert async_to_sync(scenario)() == ["run.changed", "run.changed", "run.changed", True, "run.changed", "run.changed"]


def test_a_push_reaches_a_socket_while_the_processs_one_sync_thread_is_busy() -> None:
    """Before, every push to every socket first hopped through the process's one thread for
    thread-sensitive calls (Channels closing stale database connections): a neighbour's push wave
    to its 180 sockets queued 180 hops there, and a quiet workspace's push waited behind them. Here
    that thread is held by a call that has not ended: the push must still arrive."""
    team = Team()
    communicator = _socket(f"/ws/workspaces/{team.slug}/", _cookie(_client(team, "viewer")))
    release = threading.Event()

    def occupying() -> None:
        release.wait(timeout=30)

    async def scenario() -> Any:
        try:
            assert all(ok for ok, _ in await _open([communicator]))
            held = asyncio.ensure_future(sync_to_async(occupying)())
            await asyncio.sleep(0.1)  # the one thread is in the call
            _push(team)
            try:
                return await communicator.receive_json_from(timeout=5)
            finally:
                release.set()
                await held
        finally:
            await _close([communicator])

    assert async_to_sync(scenario)()["type"] == "run.changed"


def test_a_socket_connects_while_the_processs_one_sync_thread_is_busy() -> None:
    """Channels reads a socket's session and user, and our consumers check membership, through the
    process's one thread for thread-sensitive calls: a neighbour's storm of connects queued every
    other workspace's connect behind it. Here that thread is held by a call that has not ended:
    a quiet workspace's socket must still connect, as the right user, and get its push."""
    team = Team()
    viewer = _socket(f"/ws/workspaces/{team.slug}/", _cookie(_client(team, "viewer")))
    stranger = _socket(f"/ws/workspaces/{team.slug}/", _cookie(_client(Team(), "operator")))
    release = threading.Event()

    def occupying() -> None:
        release.wait(timeout=30)

    async def scenario() -> Any:
        held = asyncio.ensure_future(sync_to_async(occupying)())
        await asyncio.sleep(0.1)  # the one thread is in the call
        try:
            (connected, _), (stranger_connected, _) = await _open([viewer, stranger])
            _push(team)
            return connected, stranger_connected, (await viewer.receive_json_from(timeout=5))["type"]
        finally:
            release.set()
            await held
            await _close([viewer, stranger])

    # Off the one thread the checks still hold: a member of another workspace is refused.
    assert async_to_sync(scenario)() == (True, False, "run.changed")


def test_it_holds_each_person_and_each_session_to_their_socket_caps(settings: Any) -> None:
    """Before, one viewer opened 1,500 sockets."""
    settings.OZ0_SOCKETS_PER_USER = 3
    settings.OZ0_SOCKETS_PER_SESSION = 2
    team = Team()
    path = f"/ws/workspaces/{team.slug}/"
    first, second, third = (_cookie(_client(team, "viewer")) for _ in range(3))
    other = _cookie(_client(team, "operator"))

    async def scenario() -> list[Any]:
        opened: list[WebsocketCommunicator] = []
        outcomes: list[Any] = []

        async def attempt(cookie: str) -> None:
            communicator = _socket(path, cookie)
            opened.append(communicator)
            connected, _ = await communicator.connect()
            assert connected
            answer = await communicator.receive_output(timeout=1) if not await communicator.receive_nothing(0.2) else None
            outcomes.append(answer.get("code") if answer else "open")

        try:
            await attempt(first)
            await attempt(first)
            await attempt(first)  # the session's third: refused
            await attempt(second)  # the person's third: open
            await attempt(third)  # the person's fourth: refused
            await attempt(other)  # someone else: open
            await opened[0].disconnect()  # a slot freed
            await attempt(third)
            return outcomes
        finally:
            await _close(opened[1:])

    refused = sockets.CLOSE_TOO_MANY
    assert async_to_sync(scenario)() == ["open", "open", refused, "open", refused, "open", "open"]


def test_signing_out_closes_the_sessions_sockets() -> None:
    """Before, a socket went on receiving pushes after its session signed out."""
    team = Team()
    client = _client(team, "viewer")
    staying = _socket(f"/ws/workspaces/{team.slug}/", _cookie(_client(team, "viewer")))
    leaving = _socket(f"/ws/workspaces/{team.slug}/", _cookie(client))

    async def scenario() -> tuple[Any, Any]:
        try:
            assert all(ok for ok, _ in await _open([staying, leaving]))
            response = await asyncio.to_thread(client.post, "/logout/")
            assert response.status_code in (200, 302)
            closed = await leaving.receive_output(timeout=5)
            _push(team)
            return closed, await staying.receive_json_from(timeout=5)
        finally:
            await _close([staying, leaving])

    closed, pushed = async_to_sync(scenario)()
    assert closed["type"] == "websocket.close" and closed.get("code") == sockets.CLOSE_SIGNED_OUT, closed
    assert pushed["type"] == "run.changed"  # the person's other session keeps its socket


@pytest.mark.parametrize(
    ("origin", "host", "accepted"),
    [
        (b"http://localhost", b"localhost", True),
        (b"http://localhost:8000", b"localhost:8000", True),
        (b"https://localhost", b"localhost:443", True),
        (b"http://localhost:8080", b"localhost", False),
        (b"http://localhost:8080", b"localhost:8000", False),
        (b"http://localhost", b"localhost:8000", False),
        # Behind a TLS-terminating proxy the Host has no port: the scheme's default is the port.
        (b"https://localhost", b"localhost", True),
        (b"http://localhost", b"localhost:443", False),
        (b"http://evil.example", b"localhost", False),
        (b"null", b"localhost", False),
        (b"", b"localhost", False),
    ],
)
def test_the_origin_must_match_scheme_host_and_port(origin: bytes, host: bytes, accepted: bool) -> None:
    """Before, only the host was compared: a page on another port of the same host could open sockets."""
    team = Team()
    communicator = _socket(f"/ws/workspaces/{team.slug}/", _cookie(_client(team, "viewer")), origin=origin, host=host)

    async def connect() -> bool:
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return bool(connected)

    assert async_to_sync(connect)() is accepted


def test_a_trusted_origin_may_differ_from_the_host(settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com:8443"]
    assert sockets.same_origin("https://console.example.com:8443", "localhost")
    assert not sockets.same_origin("https://console.example.com", "localhost")
