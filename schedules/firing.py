"""Firing: beat's sweep starts the runs of the schedules that are due.

A schedule fires once per due time however many firers run (two beats by mistake): a firer
moves the schedule's `next_fire_at` from the value it read to the next time, with a condition
on the value it read (compare-and-set), and only the one whose update matched fires. The update,
the runs it starts and the firings it records are one transaction: a firer that dies midway
leaves the time to the next pass.

Runs are created through `runs.kernel.create_run` as the schedule's owner, held to their
standing and the workspace's quotas like any create; a refusal is recorded with the kernel's
error key. Overlap with a run still going: skip, queue one (started when that run ends), or
cancel it through the kernel's `cancel_run` and start anew. After downtime, at most `catch_up`
of the due times that passed are fired (the newest); the older are recorded as missed.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs import kernel
from runs.kernel import KernelError
from runs.models import Run
from schedules import timing
from schedules.models import Firing, Schedule

log = logging.getLogger(__name__)

# Due times looked at in one pass of one schedule (a minute's cron over a week's downtime is
# 10,080), and the missed ones recorded one row each (the rest are counted in the oldest row).
SCAN_MAX = 1000
MISSED_ROWS = 50
PASS_MAX = 200


def fire_due(*, now: datetime | None = None) -> int:
    """One pass: every due schedule fired, every queued run whose predecessor ended started.
    Returns how many schedules this firer fired (another firer's win counts there)."""
    now = now or timezone.now()
    due = Schedule.objects.filter(paused=False, next_fire_at__lte=now).order_by("next_fire_at")
    fired = 0
    for pk, expected in due.values_list("pk", "next_fire_at")[:PASS_MAX]:
        if expected is None:
            continue
        try:
            fired += fire_one(pk, expected, now)
        except Exception:  # one schedule's fault must not stop the others' firing
            log.exception("schedule %s: firing failed", pk)
    for pk in Schedule.objects.filter(paused=False, queued_at__isnull=False).values_list("pk", flat=True)[:PASS_MAX]:
        try:
            start_queued(pk)
        except Exception:
            log.exception("schedule %s: starting its queued run failed", pk)
    return fired


def _next(schedule: Schedule, after: datetime) -> datetime:
    return timing.next_after(
        cron=schedule.cron,
        zone_name=schedule.timezone,
        interval_seconds=schedule.interval_seconds,
        anchor_at=schedule.anchor_at,
        after=after,
    )


def _due_times(schedule: Schedule, expected: datetime, now: datetime) -> tuple[list[datetime], bool]:
    times: list[datetime] = []
    at = expected
    while at <= now and len(times) < SCAN_MAX:
        times.append(at)
        at = _next(schedule, at)
    return times, at <= now


def fire_one(pk: int, expected: datetime, now: datetime) -> int:
    schedule = Schedule.objects.filter(pk=pk).first()
    if schedule is None:
        return 0
    times, more = _due_times(schedule, expected, now)
    with transaction.atomic():
        won = Schedule.objects.filter(pk=pk, paused=False, next_fire_at=expected).update(next_fire_at=_next(schedule, now))
        if not won:
            return 0  # another firer took this time, or the schedule changed since it was read
        schedule = Schedule.objects.select_related("owner", "workspace").get(pk=pk)
        firing = times[-schedule.catch_up :]
        _record_missed(schedule, times[: -schedule.catch_up], more)
        for due in firing:
            _fire(schedule, due)
    return 1


def _record_missed(schedule: Schedule, missed: list[datetime], more: bool) -> None:
    if not missed:
        return
    rows = missed[-MISSED_ROWS:]
    untold = len(missed) - len(rows)
    firings = [Firing(schedule=schedule, due_at=due, outcome="missed") for due in rows]
    if untold or more:
        firings[0].detail = f"and {untold}{'+' if more else ''} earlier times missed (the scheduler was down)"
    Firing.objects.bulk_create(firings)


def _record(
    schedule: Schedule, due: datetime, outcome: str, run: Any = None, error: KernelError | None = None, detail: str = ""
) -> None:
    Firing.objects.create(
        schedule=schedule,
        due_at=due,
        outcome=outcome,
        run=run,
        error_key=error.key[:64] if error else "",
        detail=(error.detail if error else detail)[:500],
    )


def _going(schedule: Schedule) -> Run | None:
    if schedule.last_run_id is None:
        return None
    return Run.objects.filter(pk=schedule.last_run_id, status__in=kernel.OPEN_RUN_STATUSES).first()


def _fire(schedule: Schedule, due: datetime) -> None:
    going = _going(schedule)
    outcome = "started"
    if going is not None:
        if schedule.overlap == "skip":
            _record(schedule, due, "skipped", run=going, detail="the previous run is still going")
            return
        if schedule.overlap == "queue":
            if schedule.queued_at is not None:
                _record(schedule, due, "skipped", run=going, detail="one run is queued already")
                return
            schedule.queued_at = due
            schedule.save(update_fields=["queued_at"])
            _record(schedule, due, "queued", run=going, detail="starts when the previous run ends")
            return
        if schedule.owner is None:
            _record(schedule, due, "refused", error=KernelError("owner_missing", "the schedule's owner was deleted"))
            return
        try:
            with transaction.atomic():
                kernel.cancel_run(run_id=going.pk, user=schedule.owner, reason=f"schedule {schedule.name}: its next run starts")
        except KernelError as error:
            _record(schedule, due, "refused", run=going, error=error)
            return
        outcome = "canceled_previous"
    _start(schedule, due, outcome)


def _start(schedule: Schedule, due: datetime, outcome: str) -> None:
    if schedule.owner is None:
        _record(schedule, due, "refused", error=KernelError("owner_missing", "the schedule's owner was deleted"))
        return
    try:
        with transaction.atomic():
            run, _ = kernel.create_run(workspace=schedule.workspace, user=schedule.owner, body=schedule.body)
    except KernelError as error:
        _record(schedule, due, "refused", error=error)
        return
    schedule.last_run = run
    schedule.save(update_fields=["last_run"])
    _record(schedule, due, outcome, run=run)


def start_queued(pk: int) -> bool:
    """A queued time starts once the run it waited for has ended (the row lock orders firers)."""
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(pk=pk, paused=False, queued_at__isnull=False).first()
        if schedule is None or _going(schedule) is not None:
            return False
        due = schedule.queued_at
        assert due is not None
        schedule.queued_at = None
        schedule.save(update_fields=["queued_at"])
        schedule = Schedule.objects.select_related("owner", "workspace").get(pk=pk)
        _start(schedule, due, "started")
    return True
