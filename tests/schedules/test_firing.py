"""Firing: runs started through the kernel as the owner, the overlap policies, bounded catch-up,
refusals recorded with the kernel's error key, pause, and one firing per time with two firers."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from runs import kernel
from runs.models import Run
from schedules import firing, services
from schedules.models import Firing, Schedule
from tenancy.models import Membership
from tests.conftest import Team
from tests.schedules.conftest import agent_of, schedule_body


def _schedule(team: Team, agent: str, **extra: Any) -> Schedule:
    body = {**schedule_body(agent), "cron": None, "interval_seconds": 60, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    return services.create(workspace=team.workspace, user=team.users["operator"], body=body)


def _due(schedule: Schedule, ago: float = 1.0) -> datetime:
    """Make the schedule due `ago` seconds ago; the moment to fire at is now."""
    now = timezone.now()
    due = now - timedelta(seconds=ago)
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=due, anchor_at=due - timedelta(seconds=60))
    return now


def _outcomes(schedule: Schedule) -> list[str]:
    return list(Firing.objects.filter(schedule=schedule).order_by("id").values_list("outcome", flat=True))


def test_it_starts_a_run_as_the_owner_through_the_kernel_and_moves_the_next_time(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent)
    now = _due(schedule)
    assert firing.fire_due(now=now) == 1
    schedule.refresh_from_db()
    run = Run.objects.get(pk=schedule.last_run_id)
    assert run.created_by == team.users["operator"] and run.agent_name == agent and run.input == {"day": "today"}
    assert schedule.next_fire_at is not None and schedule.next_fire_at > now
    row = Firing.objects.get(schedule=schedule)
    assert (row.outcome, row.run_id) == ("started", run.pk)
    assert firing.fire_due(now=now) == 0  # nothing due any more


def test_it_skips_a_time_while_the_previous_run_is_going(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent, overlap="skip")
    firing.fire_due(now=_due(schedule))
    firing.fire_due(now=_due(schedule))
    assert _outcomes(schedule) == ["started", "skipped"]
    assert Run.objects.filter(workspace=team.workspace).count() == 1


def test_it_queues_one_run_and_starts_it_when_the_previous_one_ends(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent, overlap="queue")
    firing.fire_due(now=_due(schedule))
    firing.fire_due(now=_due(schedule))
    firing.fire_due(now=_due(schedule))
    assert _outcomes(schedule) == ["started", "queued", "skipped"]  # the queue holds one
    schedule.refresh_from_db()
    first = schedule.last_run_id
    firing.fire_due(now=timezone.now() - timedelta(hours=1))  # still going: the queued one waits
    assert Run.objects.filter(workspace=team.workspace).count() == 1
    kernel.cancel_run(run_id=first, user=team.users["operator"], reason="done by hand")
    firing.fire_due(now=timezone.now() - timedelta(hours=1))
    schedule.refresh_from_db()
    assert schedule.last_run_id != first and schedule.queued_at is None
    assert _outcomes(schedule) == ["started", "queued", "skipped", "started"]
    assert Run.objects.filter(workspace=team.workspace).count() == 2


def test_it_cancels_the_previous_run_through_the_kernel_and_starts_anew(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent, overlap="cancel")
    firing.fire_due(now=_due(schedule))
    schedule.refresh_from_db()
    first = schedule.last_run_id
    firing.fire_due(now=_due(schedule))
    schedule.refresh_from_db()
    assert Run.objects.get(pk=first).status == "canceled"
    assert schedule.last_run_id != first
    assert _outcomes(schedule) == ["started", "canceled_previous"]


def test_it_fires_at_most_catch_up_missed_times_and_records_the_rest_as_missed(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent, overlap="cancel", catch_up=2)
    # Ten minutes down with a one-minute interval: eleven due times passed.
    firing.fire_due(now=_due(schedule, ago=600.5))
    outcomes = _outcomes(schedule)
    assert outcomes.count("missed") == 9
    assert outcomes[-2:] == ["started", "canceled_previous"]
    schedule.refresh_from_db()
    assert schedule.next_fire_at is not None and schedule.next_fire_at > timezone.now() - timedelta(seconds=5)


def test_a_week_of_downtime_records_a_bounded_number_of_rows(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent)
    firing.fire_due(now=_due(schedule, ago=7 * 24 * 3600))
    rows = Firing.objects.filter(schedule=schedule)
    assert rows.filter(outcome="missed").count() == firing.MISSED_ROWS
    assert "earlier times missed" in rows.filter(outcome="missed").order_by("id").first().detail  # type: ignore[union-attr]
    assert rows.filter(outcome="started").count() == 1


@pytest.mark.parametrize("role", ["viewer", "reader", None])
def test_it_records_a_refusal_when_the_owner_is_no_longer_an_operator(team: Team, agent: str, role: str | None) -> None:
    schedule = _schedule(team, agent)
    owner = Membership.objects.filter(user=team.users["operator"], workspace=team.workspace)
    if role is None:
        owner.delete()
    else:
        owner.update(role=role)
    team.users["operator"].__dict__.pop("_oz0_roles", None)
    firing.fire_due(now=_due(schedule))
    row = Firing.objects.get(schedule=schedule)
    assert row.outcome == "refused" and row.error_key == ("not_found" if role is None else "forbidden")
    assert not Run.objects.filter(workspace=team.workspace).exists()


def test_it_records_a_quota_refusal_with_the_kernels_key(team: Team, agent: str, settings: Any) -> None:
    schedule = _schedule(team, agent, overlap="queue")
    settings.OZ0_QUOTA_ACTIVE_RUNS = 1
    kernel.create_run(workspace=team.workspace, user=team.users["operator"], body={"agent": agent})
    firing.fire_due(now=_due(schedule))
    row = Firing.objects.get(schedule=schedule)
    assert (row.outcome, row.error_key) == ("refused", "quota_exceeded")


def test_a_paused_schedule_does_not_fire_and_resuming_does_not_catch_up(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent)
    services.pause(workspace=team.workspace, user=team.users["operator"], schedule_id=schedule.pk)
    now = _due(schedule, ago=600)
    assert firing.fire_due(now=now) == 0
    services.resume(workspace=team.workspace, user=team.users["operator"], schedule_id=schedule.pk)
    assert firing.fire_due(now=now) == 0
    assert not Firing.objects.filter(schedule=schedule).exists()


def test_the_firings_api_lists_outcomes_with_runs(team: Team, agent: str) -> None:
    schedule = _schedule(team, agent)
    firing.fire_due(now=_due(schedule))
    status, page = team.api("viewer").get(f"/workspaces/{team.slug}/schedules/{schedule.pk}/firings")
    assert status == 200
    [item] = page["items"]
    assert item["outcome"] == "started" and item["run"] == str(Schedule.objects.get(pk=schedule.pk).last_run_id)


@pytest.mark.usefixtures("committed", "no_dispatch")
def test_two_firers_at_once_fire_each_time_once() -> None:
    team = Team()
    agent = agent_of(team, "race-report")
    schedules = [_schedule(team, agent, name=f"race-{i}") for i in range(8)]
    # Due an hour from now, fired as if then: a live session's beat (which fires at the real
    # now) cannot take any of them while this test's two firers race.
    moment = timezone.now() + timedelta(hours=1)
    due = moment - timedelta(seconds=1)
    Schedule.objects.filter(pk__in=[s.pk for s in schedules]).update(next_fire_at=due, anchor_at=due - timedelta(seconds=60))
    barrier = threading.Barrier(2)
    fired: list[int] = []

    def firer() -> None:
        try:
            barrier.wait()
            fired.append(firing.fire_due(now=moment))
        finally:
            connection.close()

    threads = [threading.Thread(target=firer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(fired) == len(schedules)
    for schedule in schedules:
        assert _outcomes(schedule) == ["started"]
    assert Run.objects.filter(workspace=team.workspace).count() == len(schedules)
    # A firer that read the same due time late finds it moved on: its compare-and-set matches nothing.
    assert firing.fire_one(schedules[0].pk, due, moment) == 0
    assert _outcomes(schedules[0]) == ["started"]


@pytest.mark.live
def test_beat_fires_a_due_schedule_through_the_worker(live: Any) -> None:
    from tests.conftest import wait_for

    team = Team()
    schedule = _schedule(team, agent_of(team, "beat-report"))
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=timezone.now() - timedelta(seconds=1))
    wait_for(
        lambda: Firing.objects.filter(schedule=schedule, outcome="started").exists(),
        timeout=45,
        message="beat fired the schedule",
    )
    run = Run.objects.get(pk=Schedule.objects.get(pk=schedule.pk).last_run_id)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", timeout=45, message="the scheduled run completed")
