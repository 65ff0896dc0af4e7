"""The keeper (issue 29: waits hold nothing): one asyncio event loop per session-worker process that
holds the sessions waiting on a person, released from their threads.

A session whose wait on a person outlasts OZ0_SESSION_PARK_SECONDS and that cannot be parked
(a JSON-lines process, an ACP agent: their state is in their process's memory) is released
(`kernel.round_release`): its thread unwinds and goes back to the worker, and its process is
handed here. The loop reads the pipes of every released JSON-lines session (`Channel.read_ready`,
no thread each); an ACP session's conversation is served by this loop all along (acp.py). A tick
asks the database, for all of them at once on one connection (`kernel.heartbeat_many`,
`kernel.call_states`): their claims are renewed, a cancel or a lost claim is seen, and a call
that was decided is noticed. A decided session takes a session slot again
(`kernel.round_reattach`; while its workspace has none free it stays here) and a new thread
drives it on from the answer (`finish_round`, as a session's own thread would). A cancel or a
lost claim gives it a thread at once, to stop its process and report. The round's deadline stops
while it is released (time released is not running time, as time parked is not).

A released session whose process floods its output (more than the channel keeps unread,
`UNREAD_MAX`) or ends is given a thread at once, without a slot, to report its failure: its
buffer never grows past the cap, and nothing waits for a decision to notice.

A session worker lost while its sessions wait loses no run: their processes end with it (their
stdin closes), their claims stop being renewed, and the lease sweep queues each round again, its
calls answered from the journal as a retry's are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVarTuple

from django.conf import settings
from django.db import close_old_connections, connection

from oz0site import tracing
from oz0site.errors import is_database_error
from runs import kernel
from runs.worker.harness.base import HarnessSession, settled_status
from runs.worker.harness.channel import Channel
from runs.worker.reporting import replace_connection

log = logging.getLogger(__name__)

# How often the keeper asks the database whether a released session's call was decided.
POLL_SECONDS = 0.25


@dataclass
class Released:
    """A session waiting on the call `key` (task `waited`). `resume` drives it on from the answer,
    in the thread it is given again, to its end (its output); `stop` ends its process without a
    report (a test's stand-in for a lost worker). A JSON-lines session's `channel` is read here."""

    session: HarnessSession
    key: str
    waited: int
    resume: Callable[[], Any]
    stop: Callable[[], None]
    channel: Channel | None = None
    # When it was released (time.monotonic()): time released is not running time.
    since: float = field(default_factory=time.monotonic)

    @property
    def claim(self) -> str:
        return self.session.claimed.claim


class Keeper:
    """The loop's thread, one database thread, and the released sessions by claim."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.database = ThreadPoolExecutor(max_workers=1, thread_name_prefix="oz0-keeper-db")
        self.sessions: dict[str, Released] = {}
        self.ticks = 0  # the database asked after the released sessions this many times
        self.thread = threading.Thread(target=self._serve, name="oz0-session-keeper", daemon=True)
        self.thread.start()
        _wait_for_children_on(self.loop)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.create_task(self._watch())
        self.loop.run_forever()

    def take(self, released: Released) -> None:
        """Keep a released session (from the thread it leaves)."""
        self.loop.call_soon_threadsafe(self.keep, released)

    def keep(self, released: Released) -> None:
        """Keep a released session (on the loop's own thread: an ACP conversation's)."""
        self.sessions[released.claim] = released
        channel = released.channel
        if channel is None:
            return
        for fd in list(channel.open_fds):
            self.loop.add_reader(fd, self._readable, released, fd)
        if channel.out_fd not in channel.open_fds:
            self.wake(released.claim)  # it ended, or flooded, before it was handed here

    def _readable(self, released: Released, fd: int) -> None:
        channel = released.channel
        assert channel is not None
        if not channel.read_ready(fd):
            self.loop.remove_reader(fd)
        if fd == channel.out_fd and fd not in channel.open_fds:
            # Its output ended, or it wrote more than the channel keeps unread (UNREAD_MAX) or a
            # line too long: nothing more is read from it, and it is reported now, not at the decision.
            self.loop.remove_reader(fd)
            self.wake(released.claim)

    def wake(self, claim: str) -> None:
        """(On the loop's thread.) Give a released session a thread now, without a slot: its process
        ended, flooded its output, or its conversation ended; the thread reports how."""
        released = self.sessions.get(claim)
        if released is None:
            return
        self._let_go(released)
        _start_resume(released)

    def _let_go(self, released: Released) -> None:
        if released.channel is not None:
            for fd in (released.channel.out_fd, released.channel.err_fd):
                self.loop.remove_reader(fd)
        self.sessions.pop(released.claim, None)

    def drop(self, claim: str) -> Released | None:
        """Let a session go without a thread for it (a test's stand-in for a lost worker)."""

        async def dropped() -> Released | None:
            released = self.sessions.get(claim)
            if released is not None:
                self._let_go(released)
            return released

        return asyncio.run_coroutine_threadsafe(dropped(), self.loop).result(timeout=10)

    async def _watch(self) -> None:
        beaten = 0.0
        while True:
            await asyncio.sleep(POLL_SECONDS)
            if not self.sessions:
                continue
            now = time.monotonic()
            beat = now - beaten >= float(settings.OZ0_HEARTBEAT_SECONDS)
            beaten = now if beat else beaten
            try:
                due = await self.loop.run_in_executor(self.database, self._due, list(self.sessions.values()), beat)
            except Exception as error:
                log.warning("the keeper could not ask after its %d sessions: %s", len(self.sessions), error)
                continue
            self.ticks += 1
            for released in due:
                if released.claim not in self.sessions:
                    continue  # woken meanwhile (its process ended): a thread has it already
                self._let_go(released)
                _start_resume(released)
            if not self.sessions:
                # Nothing to keep: no connection held while the keeper is idle.
                await self.loop.run_in_executor(self.database, _close_connection)

    def _due(self, held: Sequence[Released], beat: bool) -> list[Released]:
        """(The database thread.) The sessions to give a thread: their call was decided and a slot
        taken, or they must stop (a cancel, a lost claim)."""
        try:
            stopping = kernel.heartbeat_many([r.claim for r in held]) if beat else set()
            states = kernel.call_states([r.waited for r in held])
            due = []
            slots = int(settings.OZ0_SESSION_SLOTS_PER_WORKSPACE)
            for released in held:
                session = released.session
                if released.claim in stopping:
                    session.cancel.set()
                elif released.waited in states and not settled_status(*states[released.waited]):
                    continue
                else:
                    taken = kernel.round_reattach(session.claimed, slots)
                    if taken is False:
                        continue  # its workspace's slots are all held: asked again next tick
                    if taken is None:
                        session.cancel.set()
                due.append(released)
            return due
        except Exception as error:
            if is_database_error(error):
                replace_connection()
            raise


def _wait_for_children_on(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio before 3.12 waits for each child process from a thread of its own by default
    (ThreadedChildWatcher): an ACP agent's process, started on the keeper's loop, would hold one
    thread as long as it lives. A pidfd watcher waits for every child on the keeper's loop instead
    (which runs as long as the process; it hands each exit to the loop that started the child)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return  # 3.12 uses pidfds itself where it can
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(KeeperChildWatcher(loop))


# What a child watcher's callback is handed after the pid and exit code.
Exited = TypeVarTuple("Exited")

if sys.version_info < (3, 12):

    class KeeperChildWatcher(asyncio.PidfdChildWatcher):
        """A pidfd watcher bound to the keeper's loop for the process's life. asyncio hands its one
        watcher to each loop the main thread sets: an `asyncio.run` there would attach it to its own
        loop, then to none, closing every pidfd it watched, and the keeper's agents' exits would go
        unheard. Bound once, this one ignores that. A child started on another loop is registered
        through the keeper's loop (a selector is not thread-safe); asyncio's own callback hands its
        exit back to the loop that started it."""

        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            super().__init__()
            super().attach_loop(loop)
            self.bound = loop

        def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
            pass

        def _on_its_loop(self) -> bool:
            try:
                return asyncio.get_running_loop() is self.bound
            except RuntimeError:
                return False

        def add_child_handler(self, pid: int, callback: Callable[[int, int, *Exited], object], *args: *Exited) -> None:
            if self._on_its_loop():
                super().add_child_handler(pid, callback, *args)
            else:
                self.bound.call_soon_threadsafe(partial(super().add_child_handler, pid, callback, *args))

        def remove_child_handler(self, pid: int) -> bool:
            if self._on_its_loop():
                return super().remove_child_handler(pid)
            self.bound.call_soon_threadsafe(partial(super().remove_child_handler, pid))
            return True


def _close_connection() -> None:
    connection.close()  # (resolved in the database thread: that thread's connection)


def _start_resume(released: Released) -> None:
    threading.Thread(target=_resume, args=(released,), name="oz0-session-resumed", daemon=True).start()


def _resume(released: Released) -> None:
    """A thread of its own drives a released session on, heartbeating it, to its report."""
    from runs.worker.execution import Heartbeat, guarded
    from runs.worker.harness import finish_round

    session = released.session
    claimed = session.claimed
    session.deadline += time.monotonic() - released.since  # the round's clock stopped while it was released
    try:
        close_old_connections()
        with Heartbeat(partial(kernel.heartbeat, claimed.claim), f"task {claimed.task_id}") as beat:
            if session.cancel.is_set():
                beat.cancel.set()
            session.cancel = beat.cancel
            with tracing.task_span(claimed):
                guarded(claimed, lambda: finish_round(session, session.timeout_seconds, released.resume))
    finally:
        connection.close()


_keeper: Keeper | None = None
_keeper_lock = threading.Lock()


def keeper() -> Keeper:
    """This process's keeper, started with the first session released."""
    global _keeper
    with _keeper_lock:
        if _keeper is None:
            _keeper = Keeper()
        return _keeper


def released_count() -> int:
    """How many released sessions this process keeps (0 when it never released one)."""
    return 0 if _keeper is None else len(_keeper.sessions)
