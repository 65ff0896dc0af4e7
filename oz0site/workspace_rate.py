"""Each workspace's rate: the JSON API requests all its members send together, the body bytes
they send to be stored, and the web process time their requests take, per second, in Redis token
buckets shared by every web process.

Why per workspace, not per person: the per-person limits (oz0site.ratelimit) bound one member, but
a workspace of many members (or one member with many tokens) together still took whatever a web
process could serve, and a neighbouring workspace's requests waited for the interpreter behind
theirs (`./oz0 bench --only neighbors`). A workspace's buckets bound what all of it takes, however
many people and tokens it has, below what the machine can serve.

Three buckets per workspace, each a rate and a burst:

* **requests**: one token per request that names the workspace (`{ws}` or a `{run_id}` of its)
  once the caller's standing there is known: OZ0_WORKSPACE_REQUESTS_PER_SECOND, up to
  OZ0_WORKSPACE_REQUEST_BURST saved up. A count: the crudest bound, for floods of cheap requests.
* **bytes**: a request's declared body length (Content-Length, known before a byte is read):
  OZ0_WORKSPACE_BYTES_PER_SECOND, up to OZ0_WORKSPACE_BYTE_BURST saved up. Run inputs are what
  the workspace stores; a verb's body is small and costs as little.
* **seconds**: the time its requests took of the server: the CPU time of the web process's
  request thread (the view, the serialization; not the time spent waiting for the interpreter,
  which is the neighbours' doing) and the time its queries took in PostgreSQL (from sending each
  to its answer, less the time the backend waited for a CPU, where the server is on this machine
  and that can be read: `QueryClock`. The database is shared by every workspace too, and a
  profile of the web process beside a busy workspace found its request threads waiting on
  PostgreSQL 41 % of the time):
  OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND, up to
  OZ0_WORKSPACE_WEB_SECONDS_BURST saved up. Measured when the response is made
  (`WorkspaceTimeMiddleware`) and charged once it is on its way (oz0site/after_response.py: the
  workspace's next request in the process waits for it), so the bucket can go below zero (at
  most a burst's worth); a request is admitted while it is above zero, or while its workspace
  used less than its share: below the average of the workspaces that used the server lately
  (each one's seconds, decaying with a time constant of `SHARE_SECONDS`). Beside a noisy workspace a quiet one's requests take
  longer, and it is not the quiet one that is refused for it; alone past its rate, a workspace is
  the average and is refused. Two heavy workspaces with nobody else about share the server.
  Requests differ a thousandfold in cost (a run read, a create of 1,000 tasks): this is the bound
  that keeps a workspace's load, whatever its requests, below what a web process can serve, with
  room left for every other workspace.

An empty bucket refuses 429 `workspace_rate_limited` (`bucket` names it) with `Retry-After` (the
seconds until the bucket holds the request's cost again) before the body is read. Only members
are charged: the buckets are taken after standing (oz0site.auth.Route), so an outsider's
requests, refused 404, never drain a workspace's budget, and every other workspace keeps its own
full buckets. The defaults are far above what a small team sends (100 requests a second from all
its members together, 1 MiB a second of bodies, a quarter of a second of server time a second
with 2 s of it at once) and are there to keep one workspace below the machine's capacity, not to
meter.

Each check is one Lua script (one round trip, atomic across processes; Redis 6.2's commands
only, as the embedded Redis is 6.2). Like the per-person limit, a Redis that cannot be reached
lets the request through: the limit protects neighbours, it is no reason to refuse work.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse

from oz0site import after_response
from oz0site.ratelimit import fail_open_client
from runs.kernel import KernelError

log = logging.getLogger(__name__)

# The seconds each workspace used lately (`SHARE_SECONDS`' memory), per install: "<used> <at>".
_USAGE = """
local function usage_of(value, now, memory)
  local space = string.find(value, ' ')
  local used, at = tonumber(string.sub(value, 1, space - 1)), tonumber(string.sub(value, space + 1))
  if now > at then used = used * math.exp((at - now) / memory) end
  return used
end
"""

# KEYS: the buckets, then the usage hash. ARGV: now (seconds), then per bucket its rate per
# second, burst and cost, then the seconds bucket's index (0: none), the workspace and the usage's
# memory. All or nothing: returns "0" when every bucket held its cost (each is taken), else
# "<index> <wait>" for the bucket that waits longest (as text: Lua numbers lose their fraction as
# Redis integers). An empty seconds bucket still admits a workspace that lately used less than
# the average of the workspaces using the server: its share.
_TAKE = (
    _USAGE
    + """
local now = tonumber(ARGV[1])
local buckets = #KEYS - 1
local seconds_index = tonumber(ARGV[3 * buckets + 2])
local workspace, memory = ARGV[3 * buckets + 3], tonumber(ARGV[3 * buckets + 4])
local function within_share()
  local all = redis.call('HGETALL', KEYS[#KEYS])
  local total, count, mine = 0, 0, 0
  for j = 1, #all, 2 do
    local used = usage_of(all[j + 1], now, memory)
    if used < 0.001 then
      redis.call('HDEL', KEYS[#KEYS], all[j])
    else
      total, count = total + used, count + 1
      if all[j] == workspace then mine = used end
    end
  end
  return count >= 2 and mine < total / count
end
local held = {}
local worst, worst_wait = 0, 0
for i = 1, buckets do
  local key = KEYS[i]
  local rate = tonumber(ARGV[3 * i - 1])
  local burst = tonumber(ARGV[3 * i])
  local cost = tonumber(ARGV[3 * i + 1])
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = tonumber(state[1]) or burst
  local at = tonumber(state[2]) or now
  if now > at then
    tokens = math.min(burst, tokens + (now - at) * rate)
    at = now
  end
  held[i] = {tokens, at}
  local short = tokens < cost and not (i == seconds_index and within_share())
  if short and (cost - tokens) / rate > worst_wait then
    worst, worst_wait = i, (cost - tokens) / rate
  end
end
if worst > 0 then
  return tostring(worst) .. ' ' .. tostring(worst_wait)
end
for i = 1, buckets do
  local key = KEYS[i]
  local burst, rate = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i - 1])
  redis.call('HSET', key, 'tokens', tostring(held[i][1] - tonumber(ARGV[3 * i + 1])), 'at', tostring(held[i][2]))
  redis.call('EXPIRE', key, math.ceil(2 * burst / rate) + 1)
end
return '0'
"""
)


# KEYS: the bucket, the usage hash. ARGV: rate per second, burst, cost, now, the workspace, the
# usage's memory. The cost is taken whatever the balance (down to minus the burst): it is what a
# request already took; and added to what the workspace used lately.
_CHARGE = (
    _USAGE
    + """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local workspace, memory = ARGV[5], tonumber(ARGV[6])
local before = redis.call('HGET', KEYS[2], workspace)
local used = before and usage_of(before, now, memory) or 0
redis.call('HSET', KEYS[2], workspace, tostring(used + cost) .. ' ' .. tostring(now))
redis.call('EXPIRE', KEYS[2], math.ceil(10 * memory))
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate)
  at = now
end
tokens = math.max(-burst, tokens - cost)
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(at))
redis.call('EXPIRE', KEYS[1], math.ceil(2 * burst / rate) + 1)
return tostring(tokens)
"""
)
# How long the share remembers a workspace's seconds (an exponential decay's time constant).
SHARE_SECONDS = 10.0
CLOCK_ATTRIBUTE = "_oz0_workspace_clock"
QUERY_CLOCK_ATTRIBUTE = "_oz0_query_clock"


class WorkspaceRateLimited(KernelError):
    status = 429

    def __init__(self, bucket: str, rate: float, retry_after: int) -> None:
        what = {"requests": "requests", "bytes": "bytes of request bodies", "seconds": "seconds of server time"}[bucket]
        super().__init__(
            "workspace_rate_limited",
            f"this workspace's members together sent more than {rate:g} {what} a second for too long; "
            f"try again in {retry_after} s",
        )
        self.retry_after = retry_after
        self.extra = {"bucket": bucket}


@lru_cache(maxsize=1)
def _client() -> redis.Redis:
    return fail_open_client(settings.REDIS_URL)


@lru_cache(maxsize=1)
def _script() -> Any:
    return _client().register_script(_TAKE)


@lru_cache(maxsize=1)
def _charge_script() -> Any:
    return _client().register_script(_CHARGE)


def buckets() -> dict[str, tuple[float, float]]:
    """Each bucket's (rate per second, burst); a rate of 0 turns that bucket off."""
    return {
        "requests": (float(settings.OZ0_WORKSPACE_REQUESTS_PER_SECOND), float(settings.OZ0_WORKSPACE_REQUEST_BURST)),
        "bytes": (float(settings.OZ0_WORKSPACE_BYTES_PER_SECOND), float(settings.OZ0_WORKSPACE_BYTE_BURST)),
        "seconds": (
            float(settings.OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND),
            float(settings.OZ0_WORKSPACE_WEB_SECONDS_BURST),
        ),
    }


def _key(bucket: str, workspace_id: int) -> str:
    # Workspaces are rows of one database: installs (and test sessions) sharing a Redis keep apart.
    return f"oz0:wsrate:{connection.settings_dict['NAME']}:{bucket}:{workspace_id}"


def usage_key() -> str:
    """The seconds each workspace of this install used lately, one hash for the share."""
    return f"oz0:wsuse:{connection.settings_dict['NAME']}"


def declared_length(request: HttpRequest) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


def admit(request: HttpRequest, workspace_id: int) -> None:
    """Charge one request and its declared body to the workspace; WorkspaceRateLimited when a bucket is empty."""
    # The server time of its requests this process answered before, still on its way, is counted first.
    after_response.settled(_charges_of(workspace_id))
    # The seconds are charged once the request has taken them: admitted while the balance is above zero.
    costs = {"requests": 1.0, "bytes": float(declared_length(request)), "seconds": 0.0}
    charged = []
    for bucket, (rate, burst) in buckets().items():
        if rate <= 0 or (costs[bucket] <= 0 and bucket != "seconds"):
            continue
        burst = max(burst, rate)
        # A single request bigger than the whole burst still passes once the bucket is full.
        charged.append((bucket, rate, burst, min(costs[bucket], burst)))
    if not charged:
        return
    args: list[Any] = [time.time()]
    for _, rate, burst, cost in charged:
        args += [rate, burst, cost]
    seconds_index = next((i for i, c in enumerate(charged, start=1) if c[0] == "seconds"), 0)
    args += [seconds_index, str(workspace_id), SHARE_SECONDS]
    try:
        keys = [*(_key(c[0], workspace_id) for c in charged), usage_key()]
        answer = _script()(keys=keys, args=args, client=_client())
    except redis.RedisError:
        log.warning("workspace rate not counted: Redis is unreachable")
        return
    text = answer.decode() if isinstance(answer, bytes) else str(answer)
    if text == "0":
        return
    index, wait = text.split()
    bucket, rate, _, _ = charged[int(index) - 1]
    raise WorkspaceRateLimited(bucket, rate, max(1, math.ceil(float(wait))))


LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def backend_schedstat(database: Any) -> Path | None:
    """The scheduler's figures of the PostgreSQL backend behind a Django connection, when the
    server runs on this machine (a loopback address or a Unix socket, and the process there is a
    postgres backend): its `/proc/<pid>/schedstat`. Else None (a server on another host, or a
    pooler in between: the pid the connection knows is not a process here)."""
    raw = getattr(database, "connection", None)
    info = getattr(raw, "info", None)
    if info is None:
        return None
    pid, host = info.backend_pid, str(info.host or "")
    remembered = getattr(database, "_oz0_backend_schedstat", None)
    if remembered is not None and remembered[0] == pid:
        return remembered[1]  # type: ignore[no-any-return]
    path: Path | None = None
    if host in LOCAL_HOSTS or host.startswith("/"):
        candidate = Path(f"/proc/{pid}")
        try:
            backend = (candidate / "comm").read_text().strip() in ("postgres", "postmaster")
            if backend and _queued_seconds(candidate / "schedstat") is not None:
                path = candidate / "schedstat"
        except OSError:
            path = None
    database._oz0_backend_schedstat = (pid, path)
    return path


def _queued_seconds(path: Path) -> float | None:
    """The seconds a process has waited for a CPU while it could run (the second field of its
    schedstat, in nanoseconds): time the machine's other load took from it. Read twice a query, so
    with the bare system calls (a quarter of `read_text`'s cost)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            fields = os.read(descriptor, 256).split()
        finally:
            os.close(descriptor)
        return int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class QueryClock:
    """The database's part of a request's server time, one query at a time (a connection's execute
    wrapper, installed by `WorkspaceTimeMiddleware` around the request): the time from sending a
    query to its answer, less the time its backend waited for a CPU meanwhile where that can be
    read (`backend_schedstat`). Waiting on a lock or a disk is the request's own occupancy of the
    database and is charged; waiting behind everyone's CPU load is not the request's doing: charged
    by the clock alone, a quiet workspace's reads took three times as long beside a noisy one and
    the quiet workspace was refused for it (14 times in 80 s; 8 once the backend's queueing was
    taken off)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        path = backend_schedstat(context.get("connection"))
        queued_before = _queued_seconds(path) if path is not None else None
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - started
            queued_after = _queued_seconds(path) if path is not None else None
            if queued_before is not None and queued_after is not None:
                took -= queued_after - queued_before
            self.seconds += max(0.0, took)


def _query_seconds(request: HttpRequest) -> float:
    clock = getattr(request, QUERY_CLOCK_ATTRIBUTE, None)
    return clock.seconds if isinstance(clock, QueryClock) else 0.0


@dataclass(frozen=True)
class WorkspaceClock:
    """Where a request's charge to its workspace started: the thread it runs on, that thread's
    CPU time and the request's query seconds at that moment."""

    workspace_id: int
    thread: int
    cpu_at_start: float
    queried_at_start: float


def start_clock(request: HttpRequest, workspace_id: int) -> None:
    """The request's server time starts counting against its workspace (its thread's CPU time and
    its queries' time from here on)."""
    if float(settings.OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND) > 0 and getattr(request, CLOCK_ATTRIBUTE, None) is None:
        clock = WorkspaceClock(workspace_id, threading.get_ident(), time.thread_time(), _query_seconds(request))
        setattr(request, CLOCK_ATTRIBUTE, clock)


def charge_time(request: HttpRequest) -> None:
    """Measure the request's server time now, on its own thread (once; best effort), and charge it
    to its workspace's seconds bucket once the response is on its way (oz0site/after_response.py):
    the client does not wait for the round trip."""
    clock = getattr(request, CLOCK_ATTRIBUTE, None)
    if not isinstance(clock, WorkspaceClock):
        return
    setattr(request, CLOCK_ATTRIBUTE, None)
    rate, burst = buckets()["seconds"]
    if rate <= 0 or clock.thread != threading.get_ident():
        return  # a response finished on another thread than the view's: its clock is not comparable
    # A query's own CPU on this side is in both figures; it is small beside the wait for the answer.
    spent = (time.thread_time() - clock.cpu_at_start) + (_query_seconds(request) - clock.queried_at_start)
    if spent <= 0:
        return
    keys = [_key("seconds", clock.workspace_id), usage_key()]
    args = [rate, max(burst, rate), spent, time.time(), str(clock.workspace_id), SHARE_SECONDS]

    def charge() -> None:
        try:
            _charge_script()(keys=keys, args=args, client=_client())
        except redis.RedisError:
            log.warning("workspace server time not counted: Redis is unreachable")

    after_response.leave(_charges_of(clock.workspace_id), charge)


def _charges_of(workspace_id: int) -> tuple[str, int]:
    return ("workspace seconds", workspace_id)


class WorkspaceTimeMiddleware:
    """Times each request's queries while the seconds bucket is on, and measures a JSON API
    request's server time once its response is made, to be charged to its workspace after it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if float(settings.OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND) <= 0:
            return self.get_response(request)  # nothing is charged: no wrapper on every query
        clock = QueryClock()
        setattr(request, QUERY_CLOCK_ATTRIBUTE, clock)
        try:
            with connection.execute_wrapper(clock):
                return self.get_response(request)
        finally:
            charge_time(request)


# ---- the workers' side: a busy workspace's messages go behind a quiet one's ----

_COUNT_MESSAGES = """
local count = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], 2)
return count
"""


@lru_cache(maxsize=1)
def _count_script() -> Any:
    return _client().register_script(_COUNT_MESSAGES)


def worker_priority(workspace_id: int | None, messages: int, at: int) -> int:
    """The Celery message priority (0 popped first, 9 last) for `messages` messages of the workspace,
    `at` being their run's (runs.kernel.priorities.message_priority).

    Quick calls hold no worker share (a chunk holds a worker for milliseconds), so a workspace that
    creates runs without pause filled the queue in front of every other workspace's quick calls:
    a quiet workspace's one call waited for thousands. A workspace that sent more than
    OZ0_WORKER_BUSY_MESSAGES_PER_SECOND messages in the current second is busy: its messages go at
    the lowest priority, so the workers take a quiet workspace's first (and the busy one's own
    order among themselves is kept as sent). 0 turns it off; Redis away: nothing is demoted.
    """
    limit = float(settings.OZ0_WORKER_BUSY_MESSAGES_PER_SECOND)
    if limit <= 0 or workspace_id is None or messages <= 0:
        return at
    key = f"oz0:wsmsgs:{connection.settings_dict['NAME']}:{workspace_id}:{int(time.time())}"
    try:
        count = int(_count_script()(keys=[key], args=[messages], client=_client()))
    except redis.RedisError:
        return at
    return 9 if count > limit else at
