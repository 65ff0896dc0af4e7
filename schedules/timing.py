"""When a schedule is due: a cron expression read in its time zone, or an interval from an anchor.

Pure functions of their arguments; every datetime in and out is aware, and out in UTC.
"""

from __future__ import annotations

import functools
import zoneinfo
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter  # type: ignore[import-untyped]
from django.conf import settings

from runs.kernel import InvalidRequest, whole_number

CRON_ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
CRON_MAX = 200
INTERVAL_MAX_SECONDS = 366 * 24 * 3600


@functools.lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def min_interval_seconds() -> int:
    return int(settings.OZ0_SCHEDULE_MIN_INTERVAL_SECONDS)


def check_zone(name: object) -> zoneinfo.ZoneInfo:
    # Looked up in the list of known zones, never opened as a path a caller names.
    if not isinstance(name, str) or name not in _zones():
        raise InvalidRequest("unknown_timezone", f"{str(name)[:64]!r} is no IANA time zone (e.g. Europe/Paris, UTC)")
    return zoneinfo.ZoneInfo(name)


def check_cron(expression: object, zone: zoneinfo.ZoneInfo) -> str:
    """Five fields (minute hour day month weekday) or an @alias; one that never matches is refused too."""
    if not isinstance(expression, str) or not expression.strip() or len(expression) > CRON_MAX:
        raise InvalidRequest("invalid_cron", f"a cron expression is a non-empty string of at most {CRON_MAX} characters")
    text = " ".join(expression.split())
    if text not in CRON_ALIASES and len(text.split(" ")) != 5:
        raise InvalidRequest("invalid_cron", "a cron expression has five fields: minute hour day-of-month month day-of-week")
    try:
        if not croniter.is_valid(text):
            raise InvalidRequest("invalid_cron", f"{text!r} is not a cron expression")
        croniter(text, datetime.now(zone)).get_next(datetime)
    except (CroniterBadCronError, CroniterBadDateError, CroniterError, ValueError, KeyError, OverflowError):
        raise InvalidRequest("invalid_cron", f"{text!r} never fires or is not a cron expression") from None
    return text


def check_interval(seconds: object) -> int:
    low = min_interval_seconds()
    number = whole_number(seconds)
    if number is None or not low <= number <= INTERVAL_MAX_SECONDS:
        raise InvalidRequest("invalid_interval", f"interval_seconds is a whole number from {low} to {INTERVAL_MAX_SECONDS}")
    return number


def next_after(*, cron: str, zone_name: str, interval_seconds: int | None, anchor_at: datetime, after: datetime) -> datetime:
    """The first due time strictly after `after`."""
    if cron:
        zone = zoneinfo.ZoneInfo(zone_name)
        following = croniter(cron, after.astimezone(zone)).get_next(datetime)
        return following.astimezone(UTC)
    assert interval_seconds
    step = timedelta(seconds=interval_seconds)
    if after < anchor_at + step:
        return (anchor_at + step).astimezone(UTC)
    passed = (after - anchor_at) // step
    return (anchor_at + (passed + 1) * step).astimezone(UTC)


def upcoming(
    *, cron: str, zone_name: str, interval_seconds: int | None, anchor_at: datetime, first: datetime, count: int
) -> list[datetime]:
    """`first` (the stored next fire time) and the due times after it."""
    times = [first]
    while len(times) < count:
        times.append(
            next_after(cron=cron, zone_name=zone_name, interval_seconds=interval_seconds, anchor_at=anchor_at, after=times[-1])
        )
    return times
