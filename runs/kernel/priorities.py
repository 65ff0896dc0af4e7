"""Run priorities (issue 33 item 3): a run's priority, 0 (low) to 9 (high), orders the dispatch of
its queued tool calls and model rounds within its workspace's share of the workers, with aging.

What is guaranteed, and where (README "Priorities"):
- A call over its workspace's share waits in the database (runs.kernel.worker); when one of the
  workspace's workers comes free, `send_within_share` hands on the queued calls of the highest
  *effective* priority first: the run's priority plus one step for every OZ0_PRIORITY_AGING_SECONDS
  the call has waited since it first found no room (`waiting_for_share` in its state), ties to the
  longest waiting, then to the oldest made. So a call of priority p waiting w seconds goes before
  any call of priority q waiting less than w - (q - p) * aging: no call waits for ever.
- The lost-message sweep sends again the highest priority first.
- Every message to the workers carries the run's priority (Celery message priority: Redis keeps a
  list per step, `priority_steps`, and a worker pops the highest list first). That order is
  best effort across workspaces: a message already fetched by a worker (prefetch) is not passed,
  and a workspace that sent more than OZ0_WORKER_BUSY_MESSAGES_PER_SECOND messages this second
  sends the rest at the lowest priority, behind every quiet workspace's (runs.worker.dispatch).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import F, Q, QuerySet
from django.db.models.expressions import RawSQL

from runs.kernel.errors import InvalidRequest
from runs.kernel.numbers import whole_number

LOWEST, HIGHEST = 0, 9
NAMES = {"low": 0, "normal": 5, "high": 9}
DEFAULT = NAMES["normal"]
# The state key of a call over its workspace's share: {"since": when it first found no room}.
WAITING_KEY = "waiting_for_share"


def parse_priority(value: Any, *, inherited: int | None = None) -> int:
    """A request's `priority`: a whole number 0-9 or low/normal/high; absent, the inherited one
    (a parent's), else normal."""
    if value is None:
        return DEFAULT if inherited is None else inherited
    if isinstance(value, str) and value in NAMES:
        return NAMES[value]
    number = whole_number(value)  # JSON has one number type: 5.0 is the whole number 5
    if number is not None and LOWEST <= number <= HIGHEST:
        return number
    raise InvalidRequest("invalid_field", "`priority` must be a whole number from 0 to 9, or one of low, normal, high")


def name_of(priority: int) -> str:
    """The word the console shows beside the number."""
    return {v: k for k, v in NAMES.items()}.get(priority, str(priority))


def aging_seconds() -> float:
    return max(0.001, float(settings.OZ0_PRIORITY_AGING_SECONDS))


def message_priority(priority: int) -> int:
    """The Celery message priority on Redis, where 0 is popped first: the inverse of the run's."""
    return HIGHEST - max(LOWEST, min(HIGHEST, int(priority)))


def by_effective_priority(tasks: QuerySet[Any], now: Any) -> QuerySet[Any]:
    """Queued tasks (joined to their runs) ordered as `send_within_share` hands them on."""
    # A since that is not the timestamp `defer_queued` wrote counts as no wait (never a failed cast).
    text = f"(runs_task.state #>> '{{{WAITING_KEY},since}}')"
    since = f"(CASE WHEN {text} ~ '^\\d{{4}}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d(\\.\\d+)?\\+00:00$' THEN {text}::timestamptz ELSE %s END)"
    return tasks.annotate(
        waited_since=RawSQL(since, [now]),
        aged=RawSQL(f"FLOOR(GREATEST(0, EXTRACT(EPOCH FROM (%s - {since}))) / %s)::int", [now, now, aging_seconds()]),
    ).order_by((F("run__priority") + F("aged")).desc(), "waited_since", "pk")


def waiting_since(state: dict[str, Any]) -> str | None:
    waiting = state.get(WAITING_KEY)
    return str(waiting.get("since")) if isinstance(waiting, dict) and waiting.get("since") else None


def over_share() -> Q:
    """Queued tasks that found no room at least once."""
    return Q(state__has_key=WAITING_KEY)
