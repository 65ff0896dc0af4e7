"""Due times: cron read in its zone across daylight-saving changes, and intervals from an anchor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from schedules import timing


def test_a_cron_is_read_in_its_zone_across_a_daylight_saving_change() -> None:
    # Paris moves from UTC+1 to UTC+2 on 2027-03-28: 09:00 local is 08:00 UTC, then 07:00 UTC.
    after = datetime(2027, 3, 26, 12, 0, tzinfo=UTC)
    times = timing.upcoming(
        cron="0 9 * * *",
        zone_name="Europe/Paris",
        interval_seconds=None,
        anchor_at=after,
        first=timing.next_after(cron="0 9 * * *", zone_name="Europe/Paris", interval_seconds=None, anchor_at=after, after=after),
        count=4,
    )
    assert [(t.day, t.hour) for t in times] == [(27, 8), (28, 7), (29, 7), (30, 7)]
    assert all(t.tzinfo is not None and t.utcoffset() == timedelta(0) for t in times)


def test_a_cron_at_a_local_time_that_does_not_exist_still_moves_forward() -> None:
    after = datetime(2027, 3, 27, 12, 0, tzinfo=UTC)
    first = timing.next_after(cron="30 2 * * *", zone_name="Europe/Paris", interval_seconds=None, anchor_at=after, after=after)
    second = timing.next_after(cron="30 2 * * *", zone_name="Europe/Paris", interval_seconds=None, anchor_at=after, after=first)
    assert after < first < second


def test_an_interval_counts_from_its_anchor() -> None:
    anchor = datetime(2027, 1, 1, tzinfo=UTC)
    step: dict[str, Any] = {"cron": "", "zone_name": "UTC", "interval_seconds": 600, "anchor_at": anchor}
    assert timing.next_after(**step, after=anchor) == anchor + timedelta(minutes=10)
    assert timing.next_after(**step, after=anchor + timedelta(minutes=25)) == anchor + timedelta(minutes=30)
    assert timing.next_after(**step, after=anchor + timedelta(minutes=30)) == anchor + timedelta(minutes=40)
