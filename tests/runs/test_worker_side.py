"""The worker side's seams: Celery task names outlive the move, and the tool catalog runs nothing."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pytest

from tests.conftest import ROOT

# The names queued messages and the beat schedule carry; they stay when the code moves.
TASK_NAMES = {"runs.tasks.execute_task", "runs.tasks.execute_batch", "runs.tasks.sweep", "runs.tasks.noop"}
# The notify app's (notify/tasks.py): beat runs its sweep, which queues digest deliveries.
NOTIFY_TASK_NAMES = {"notify.tasks.sweep", "notify.tasks.deliver_digest", "notify.tasks.sweep_deadlines"}


def test_it_keeps_the_task_names_messages_and_beat_carry(settings: Any) -> None:
    from oz0site.celery import app

    app.loader.import_default_modules()  # what a worker does at start: the autodiscovery
    assert {name: app.tasks[name].__module__ for name in TASK_NAMES} == dict.fromkeys(TASK_NAMES, "runs.worker.tasks")
    assert {name: app.tasks[name].__module__ for name in NOTIFY_TASK_NAMES} == dict.fromkeys(NOTIFY_TASK_NAMES, "notify.tasks")
    others = {"schedules.tasks.fire_due": "schedules.tasks", "schedules.tasks.prune": "schedules.tasks"}
    others["insights.tasks.sweep_rollouts"] = "insights.tasks"
    assert {name: app.tasks[name].__module__ for name in others} == others
    assert {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()} <= TASK_NAMES | NOTIFY_TASK_NAMES | set(others)


def test_it_reads_the_tool_catalog_without_celery_or_the_worker() -> None:
    probe = (
        "import sys, runs.tools as catalog;"
        "loaded = [m for m in sys.modules if m == 'celery' or m.startswith(('celery.', 'runs.worker', 'runs.models'))];"
        "assert not loaded, loaded;"
        "assert catalog.is_registered('test.echo')"
    )
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True)


def test_it_has_a_function_for_every_worker_tool_and_none_for_runner_tools(settings: Any) -> None:
    from runs.tools import get_tool, tool_names
    from runs.worker.tool_functions import FUNCTIONS

    settings.OZ0_TEST_TOOLS = True  # every tool of the catalog, the test tools too
    tools = [get_tool(name) for name in tool_names()]
    assert {tool.name for tool in tools if tool is not None and not tool.runner} == set(FUNCTIONS)


def test_beat_sends_no_sweep_to_the_workers_and_what_it_sends_expires(settings: Any) -> None:
    """The run sweeps are beat's own (runs.worker.periodic.Sweeper), never a message that waits
    behind the calls whose holders it watches; what beat still sends expires after one period,
    since a message that waited that long is stale and the next is on its way."""
    assert "runs.tasks.sweep" not in {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert 0 < entry["options"]["expires"] <= float(entry["schedule"]), name


def test_the_sweeper_gives_holders_the_time_it_could_not_see_the_database() -> None:
    """After an outage no holder could heartbeat through, the lease is lengthened by the outage for
    as long as the outage lasted (a lease at least); a short gap (a slow pass) gives nothing."""
    from runs.worker.periodic import DatabaseWatch

    watch = DatabaseWatch(period=0.5, lease=5)
    watch.answered(100.0)
    assert watch.grace(100.5) == 0.0
    assert watch.grace(102.0) == 0.0  # 1.5 s gap: under half a lease
    for now in (101.0, 103.0, 107.0, 111.0):
        watch.unreachable(now)  # the sweeps fail on the database
    assert watch.grace(112.0) == pytest.approx(11.5)  # the database away since 100.0
    watch.answered(112.5)  # it answers again: the blind time counts for as long again
    assert watch.grace(113.0) == pytest.approx(12.0)
    for now in (113.0, 114.5, 116.0, 117.5, 119.0, 120.5, 122.0, 123.5):
        watch.answered(now)
    assert watch.grace(118.0) == pytest.approx(12.0)  # a lease since it came back: still away as long
    assert watch.grace(124.4) == pytest.approx(12.0)
    assert watch.grace(124.6) == 0.0  # as long as it was away since it came back

    short = DatabaseWatch(period=0.5, lease=5)
    short.answered(100.0)
    short.unreachable(101.0)
    short.answered(104.0)  # 3.5 s blind, under a lease: holders get the lease
    for now in (105.0, 106.0, 107.0, 108.0, 109.0):
        short.answered(now)
    assert short.grace(108.9) == pytest.approx(3.5)
    assert short.grace(109.1) == 0.0


def test_a_sweeper_that_was_itself_stopped_gives_holders_one_lease_not_its_pause() -> None:
    """No sweep failed: the sweeper was stopped or starved (a frozen process), not the database
    away. The holders went on heartbeating; the dead among them are handed on a lease after it
    runs again, not as late as it was paused."""
    from runs.worker.periodic import DatabaseWatch

    watch = DatabaseWatch(period=0.5, lease=5)
    watch.answered(100.0)
    watch.answered(160.5)  # a minute without a pass, and nothing failed
    for now in (161.0, 162.0, 163.0, 164.0, 165.0):
        watch.answered(now)
    assert watch.grace(165.4) == pytest.approx(60.0)
    assert watch.grace(165.6) == 0.0  # a lease after it ran again


def test_a_claims_sweep_that_fails_on_the_database_marks_the_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    from runs.worker import periodic

    watch = periodic.DatabaseWatch(period=0.5, lease=5)

    def unreachable(**_: object) -> int:
        raise OperationalError("connection refused")

    monkeypatch.setattr(periodic.kernel, "sweep_expired_claims", unreachable)
    with pytest.raises(OperationalError):
        periodic._expired_claims(watch)
    assert watch.unreachable_since is not None
    monkeypatch.setattr(periodic.kernel, "sweep_expired_claims", lambda **_: 0)
    periodic._expired_claims(watch)
    assert watch.unreachable_since is None


def test_the_lost_message_sweep_reads_the_broker_on_one_client_that_outlives_a_dropped_connection(settings: Any) -> None:
    """The sweeper asks the broker every pass whether a message still waits; one client serves
    every pass (no new connection each time) and reconnects after its connection was dropped."""
    import redis

    from oz0site.metering import priority_lists
    from runs.worker import periodic

    settings.CELERY_TASK_DEFAULT_QUEUE = f"oz0-sweep-probe-{uuid.uuid4().hex[:8]}"
    settings.OZ0_SESSION_QUEUE = f"{settings.CELERY_TASK_DEFAULT_QUEUE}.sessions"
    probe = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    waiting = priority_lists(settings.OZ0_SESSION_QUEUE)[-1]
    try:
        assert periodic.broker_queue_empty() is True
        client = periodic._broker(settings.CELERY_BROKER_URL)
        probe.rpush(waiting, "a message")
        assert periodic.broker_queue_empty() is False
        client.connection_pool.disconnect()  # as after a Redis restart
        probe.delete(waiting)
        assert periodic.broker_queue_empty() is True
        assert periodic._broker(settings.CELERY_BROKER_URL) is client
    finally:
        probe.delete(waiting)
        probe.close()
