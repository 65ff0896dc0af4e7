"""What processes count for /metrics: lease expiries and sweep durations (beat), webhook failures
(workers), HTTP latency (each web process), kept in Redis so every process's counts add up.

Why Redis and not prometheus_client's multiprocess mode: oz0's processes run on several machines
(workers, beat, web), and a scrape reaches one web process; the multiprocess mode sums files in a
directory one machine shares, and needs the library, which is not installed. Redis is already
every process's shared place (broker, cache). Each process adds its counts into a dictionary in
memory (a lock and an addition per event: nothing on the request's path waits for Redis) and a
thread of its own adds them into one Redis hash every OZ0_METRICS_FLUSH_SECONDS with one pipeline
of HINCRBYFLOAT. A scrape reads the hash with one HGETALL. A process that dies loses at most its
last interval's counts; a Redis that is away keeps them in memory until it answers again.

A field of the hash is a sample's name, its labels (as the exposition writes them) and, for a
histogram's bucket, its bound, joined by a unit separator. A bucket field counts the observations
that fell in that bucket alone (an observation adds to one field, not to every bucket above it:
a latency series keeps 3 or 4 fields, not 15); the scrape makes them cumulative, zeros included.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterable

import redis
from django.conf import settings

log = logging.getLogger(__name__)

# Seconds: from a cached page to a long sweep; /wait's long polls land in the last buckets.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def hash_key() -> str:
    return f"oz0:metrics:{settings.CELERY_TASK_DEFAULT_QUEUE}"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_text(labels: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{name}="{escape_label(str(value))}"' for name, value in labels)


SEPARATOR = "\x1f"


def field(name: str, labels: Iterable[tuple[str, str]] = (), bound: str = "") -> str:
    return SEPARATOR.join((name, label_text(labels), bound))


def split_field(text: str) -> tuple[str, str, str]:
    name, labels, bound = text.split(SEPARATOR)
    return name, labels, bound


def bucket_bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class Meter:
    """One process's counts waiting to be added into Redis."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.pending: dict[str, float] = {}
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()

    def _add(self, additions: Iterable[tuple[str, float]]) -> None:
        if self.pid != os.getpid():  # a forked child (a prefork worker) starts with nothing of its parent's
            self._reset()
        with self.lock:
            for name, amount in additions:
                self.pending[name] = self.pending.get(name, 0.0) + amount
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="oz0-metrics", daemon=True)
                self.thread.start()

    def count(self, name: str, labels: Iterable[tuple[str, str]] = (), by: float = 1.0) -> None:
        self._add([(field(name, labels), float(by))])

    def observe(self, name: str, labels: Iterable[tuple[str, str]], value: float) -> None:
        """One observation of a histogram (buckets: LATENCY_BUCKETS)."""
        pairs = list(labels)
        bound = next((b for b in LATENCY_BUCKETS if value <= b), float("inf"))
        self._add(
            [
                (field(f"{name}_bucket", pairs, bucket_bound(bound)), 1.0),
                (field(f"{name}_sum", pairs), float(value)),
                (field(f"{name}_count", pairs), 1.0),
            ]
        )

    def flush(self) -> None:
        """Add what this process counted into Redis; kept for the next flush if Redis is away."""
        with self.lock:
            taken, self.pending = self.pending, {}
        if not taken:
            return
        try:
            pipe = shared_client(settings.REDIS_URL).pipeline(transaction=False)
            for name, amount in taken.items():
                pipe.hincrbyfloat(hash_key(), name, amount)
            pipe.execute()
        except redis.RedisError as error:
            log.warning("metrics could not be written to Redis (kept for the next try): %s", error)
            with self.lock:
                for name, amount in taken.items():
                    self.pending[name] = self.pending.get(name, 0.0) + amount

    def _loop(self) -> None:
        every = max(0.05, float(settings.OZ0_METRICS_FLUSH_SECONDS))
        while not self.stopping.wait(every):
            try:
                self.flush()
            except Exception:  # nothing may end the flusher
                log.exception("a metrics flush failed")

    def close(self) -> None:
        """At the process's exit: the flusher ends, then the last counts go. The flusher must not be
        mid-flush when the interpreter finalizes: a daemon thread stopped there keeps its Redis
        pool's lock, and the client's finalizer then waits on that lock forever (a pytest process
        of one sign-in test hung so at its exit 7 times in 10; 0 in 10 with this)."""
        if self.pid != os.getpid():
            return
        self.stopping.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=FLUSH_JOIN_SECONDS)
        self.flush()
        close_shared_clients()


# At most a flush's socket timeouts (connect and read: 2 s each) and some.
FLUSH_JOIN_SECONDS = 5.0

meter = Meter()
atexit.register(meter.close)


_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def shared_client(url: str) -> redis.Redis:
    """One client (its connection pool) per URL and process, for the scrapes: a scrape that
    connected anew each time would pay the connection on every scrape."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        return client


def close_shared_clients() -> None:
    """Closed while every thread still runs, so no finalizer of theirs waits on a pool's lock."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()


def read_all(queues: Iterable[str] = ()) -> tuple[dict[str, float], list[int]]:
    """Every process's counts, by field (see `field`), and the lengths of the broker's `queues`:
    one pipeline, one round trip (the broker is REDIS_URL's server)."""
    pipe = shared_client(settings.REDIS_URL).pipeline(transaction=False)
    names = list(queues)
    for queue in names:
        for name in priority_lists(queue):
            pipe.llen(name)
    pipe.hgetall(hash_key())
    *lengths, raw = pipe.execute()
    steps = len(priority_lists(""))
    per_queue = [sum(int(n) for n in lengths[i * steps : (i + 1) * steps]) for i in range(len(names))]
    return {name.decode(): float(value) for name, value in raw.items()}, per_queue


def priority_lists(queue: str) -> list[str]:
    """The Redis lists a Celery queue's messages wait in: one per message priority step (kombu's
    redis transport names them `queue`, then `queue<sep><step>`)."""
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    sep = str(options.get("sep", "\x06\x16"))
    steps = sorted({int(step) for step in options.get("priority_steps", [0, 3, 6, 9])})
    return [queue if not step else f"{queue}{sep}{step}" for step in steps]
