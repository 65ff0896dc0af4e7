"""What runs on a clock: beat's sweeps, and the workers' proof of life that /healthz reads.

The sweeps (expired claims, clocks, lost messages, executor leases, unserved runner calls, a
child's lost settle or cancel, expired idempotency keys) run every OZ0_SWEEP_SECONDS in a thread of
beat's own process (`Sweeper`, started by oz0site.celery when beat starts), never as messages
on the workers' queue: there a sweep waited behind the very calls whose holders it must watch
(two slots busy with long calls meant no sweep, so a dead holder's call did not move on). Between
two passes the sweeper wakes for each lease that runs out and sweeps the claims alone, so a dead
holder's call moves on at its lease rather than up to a period after it.

A sweep that fails is logged and the others still run; the next pass tries it again. A sweep
waits at most half the period for one run's row lock (runs.kernel.commit.locked's `wait`): a run
another transaction holds longer (a neighbour's large append) waits for the next pass, and every
other workspace's claims and clocks are swept meanwhile. A sweeper
that could not see the database for a while (an outage) gives every holder that much more time
before its lease counts as expired (`DatabaseWatch`): no holder could heartbeat meanwhile either.

Retention (`Pruner`) runs in another thread of beat's, every OZ0_PRUNE_SECONDS: a pass over tens
of millions of trace rows takes minutes, and the claims sweep must not wait behind it.

Workers stamp their own liveness (`WorkerAlive`, a thread of the worker's main process) every
quarter of OZ0_WORKER_STALE_SECONDS, however busy their slots are.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import lru_cache

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import close_old_connections, connections

from oz0site.errors import is_database_error
from oz0site.metering import meter, priority_lists
from runs import idempotency, kernel, retention
from runs.worker.reporting import replace_connection

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def _broker(url: str) -> redis.Redis:
    """One client per broker for the sweeper's passes (its pool reconnects after an outage), not a
    new connection every pass."""
    return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)


def broker_queue_empty() -> bool:
    """Whether no message waits in the workers' or the sessions' queues, at any priority: every
    list's length in one round trip (they were a round trip each, a third of an idle pass's CPU)."""
    queues = (settings.CELERY_TASK_DEFAULT_QUEUE, settings.OZ0_SESSION_QUEUE)
    with _broker(settings.CELERY_BROKER_URL).pipeline(transaction=False) as pipe:
        for queue in queues:
            for name in priority_lists(queue):
                pipe.llen(name)
        return not any(int(length) for length in pipe.execute())


def record_worker_heartbeat() -> None:
    cache.set(settings.OZ0_WORKER_HEARTBEAT_KEY, time.time(), timeout=3600)


def record_sweep() -> None:
    cache.set(settings.OZ0_SWEEP_HEARTBEAT_KEY, time.time(), timeout=3600)


class DatabaseWatch:
    """How long the sweeper lately could not see the database, so that an outage does not count
    against the holders of claims: during it they could not heartbeat either.

    A gap between two answers of the database longer than the sweep period plus half a lease is
    blind time. After the database answers again, the claims sweep adds the blind time to the
    lease (its `grace`) for a lease; after an outage the sweeper saw (its passes failed on the
    database), for as long as the outage lasted, if that is longer. A shorter gap needs nothing: a
    holder heartbeating more often than every half lease was stale by less than a lease.

    Why longer after an outage: the database answers the sweeper first, not everyone at once. A
    server back from a crash on a busy machine serves each process as it reconnects, and a live
    holder was once heard again only after the short test lease (5 s) had run out, its call then
    taken for lost. A holder that died during the outage is handed on that much later, which an
    outage that long has delayed already. A sweeper that was itself stopped or starved saw nothing
    fail: the holders went on heartbeating meanwhile, and the dead among them are handed on a
    lease after it runs again, as before."""

    def __init__(self, period: float, lease: float) -> None:
        self.period = period
        self.lease = lease
        self.last_answer: float | None = None
        self.unreachable_since: float | None = None
        self.blind = 0.0
        self.blind_ended = float("-inf")
        self.blind_window = lease

    def _blind_before(self, now: float) -> float:
        if self.last_answer is None:
            return 0.0
        gap = now - self.last_answer - self.period
        return gap if gap > self.lease / 2 else 0.0

    def _recent(self, now: float) -> float:
        """The last blind time, while holders may still be coming back from it."""
        return self.blind if now - self.blind_ended < self.blind_window else 0.0

    def grace(self, now: float) -> float:
        """Seconds to add to the lease for a sweep starting now."""
        return max(self._blind_before(now), self._recent(now))

    def unreachable(self, now: float) -> None:
        """A sweep starting about now failed on the database."""
        if self.unreachable_since is None:
            self.unreachable_since = now

    def answered(self, now: float) -> None:
        """The database answered a sweep that ended now."""
        blind = self._blind_before(now)
        if blind:
            self.blind, self.blind_ended = max(blind, self._recent(now)), now
            outage = self.unreachable_since is not None
            self.blind_window = max(self.lease, self.blind) if outage else self.lease
        self.unreachable_since = None
        self.last_answer = now


def _watch_for_settings() -> DatabaseWatch:
    return DatabaseWatch(float(settings.OZ0_SWEEP_SECONDS), float(settings.OZ0_LEASE_SECONDS))


_default_watch: DatabaseWatch | None = None


def _expired_claims(watch: DatabaseWatch) -> int:
    try:
        swept = kernel.sweep_expired_claims(grace=watch.grace(time.monotonic()))
    except Exception as error:
        if is_database_error(error):
            watch.unreachable(time.monotonic())
        raise
    watch.answered(time.monotonic())
    if swept:
        meter.count("oz0_lease_expiries_total", (("kind", "claim"),), swept)
    return swept


def _expired_leases() -> int:
    expired = kernel.sweep_expired_leases()
    if expired:
        meter.count("oz0_lease_expiries_total", (("kind", "executor"),), expired)
    return expired


def _lost_messages() -> object:
    return kernel.sweep_lost_messages(broker_queue_empty=broker_queue_empty())


SWEEPS: tuple[tuple[str, Callable[[], object]], ...] = (
    ("clocks", kernel.sweep_clocks),
    ("lost-message", _lost_messages),
    ("executor lease", _expired_leases),
    ("unserved-call", kernel.sweep_unserved_calls),
    ("delegation", kernel.sweep_delegations),
    ("idempotency-key", idempotency.sweep_expired_keys),
)


def run_all(watch: DatabaseWatch | None = None) -> None:
    """One pass: every sweep, each guarded. A database error replaces the connection for the next."""
    global _default_watch
    if watch is None:
        _default_watch = _default_watch or _watch_for_settings()
        watch = _default_watch
    try:
        record_sweep()
    except Exception as error:  # Redis away: the sweeps still run
        log.warning("the sweep's heartbeat could not be recorded: %s", error)
    for name, sweep in (("claims", lambda: _expired_claims(watch)), *SWEEPS):
        _guarded(name, sweep)


def _guarded(name: str, sweep: Callable[[], object]) -> bool:
    """One sweep, timed; False when it failed (logged; a database error replaces the connection
    for the next)."""
    started = time.perf_counter()
    try:
        sweep()
    except Exception as error:
        log.exception("the %s sweep failed", name)
        if is_database_error(error):
            replace_connection()
        return False
    finally:
        meter.observe("oz0_sweep_duration_seconds", (("sweep", name),), time.perf_counter() - started)
    return True


# How long after a lease's end the sweeper wakes for it: the claims sweep takes a lease as ended only
# once it is strictly past, and a wake a moment early would find nothing and wait for the next.
CLAIM_WAKE_MARGIN = 0.02


class Sweeper:
    """Beat's sweeps, every OZ0_SWEEP_SECONDS, in a thread of beat's own process."""

    def __init__(self) -> None:
        self.period = float(settings.OZ0_SWEEP_SECONDS)
        self.watch = _watch_for_settings()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="oz0-sweeper", daemon=True)

    def start(self) -> Sweeper:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        log.info("sweeping every %.1fs", self.period)
        pause = 0.0
        try:
            while not self.stopped.wait(pause):
                started = time.monotonic()
                close_old_connections()  # honours DB_CONN_MAX_AGE, drops a connection left unusable
                try:
                    run_all(self.watch)
                except Exception:  # nothing may end the sweeper
                    log.exception("a sweep pass failed")
                self._claims_until(started + self.period)
                pause = max(0.0, started + self.period - time.monotonic())
        finally:
            connections.close_all()  # this thread's own

    def _claims_until(self, next_pass: float) -> None:
        """Between two passes, wake for each lease that runs out before the next one and sweep the
        claims alone: a dead holder's call moves on at its lease, not up to a period after it. The
        other sweeps keep the period, and two claims-only wakes are a tenth of a period apart at least."""
        floor = self.period / 10
        not_before = time.monotonic()
        while True:
            due = self._next_claim_expiry()
            if due is None or due >= next_pass - floor:
                return
            if self.stopped.wait(max(0.0, max(due, not_before) - time.monotonic())):
                return
            close_old_connections()
            if not _guarded("claims", lambda: _expired_claims(self.watch)):
                return  # the next pass tries again
            not_before = time.monotonic() + floor

    def _next_claim_expiry(self) -> float | None:
        """When (time.monotonic()) the next held call's lease runs out, a little after, so that
        the sweep finds it past; None when no call is held or the database does not answer."""
        try:
            seconds = kernel.seconds_to_next_claim_expiry(grace=self.watch.grace(time.monotonic()))
        except Exception as error:  # nothing may end the sweeper: the passes keep the period
            if is_database_error(error):
                replace_connection()
            else:
                log.exception("the next lease's end could not be read")
            return None
        return None if seconds is None else time.monotonic() + seconds + CLAIM_WAKE_MARGIN


class Pruner:
    """Retention's passes (runs/retention.py), every OZ0_PRUNE_SECONDS, in a thread of beat's own."""

    def __init__(self) -> None:
        self.period = float(settings.OZ0_PRUNE_SECONDS)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="oz0-pruner", daemon=True)

    def start(self) -> Pruner:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        while not self.stopped.wait(self.period):
            close_old_connections()
            try:
                pruned = retention.prune()
                meter.count("oz0_pruned_rows_total", (("table", "trace"),), pruned.trace)
                meter.count("oz0_pruned_rows_total", (("table", "findings"),), pruned.findings)
                meter.observe("oz0_sweep_duration_seconds", (("sweep", "retention"),), pruned.seconds)
            except Exception as error:  # nothing may end the pruner; the next pass tries again
                log.exception("a retention pass failed")
                if is_database_error(error):
                    replace_connection()


class WorkerAlive:
    """A worker's proof of life for /healthz: its main process stamps the heartbeat key every
    quarter of OZ0_WORKER_STALE_SECONDS, whatever its slots are busy with."""

    def __init__(self) -> None:
        self.every = max(0.5, float(settings.OZ0_WORKER_STALE_SECONDS) / 4)
        self.thread = threading.Thread(target=self._loop, name="oz0-worker-alive", daemon=True)

    def start(self) -> WorkerAlive:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while True:
            try:
                record_worker_heartbeat()
            except Exception as error:  # Redis away: try again next time
                log.warning("the worker heartbeat could not be recorded: %s", error)
            time.sleep(self.every)
