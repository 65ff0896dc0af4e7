"""A beat-sent sweep whose database is away skips that pass with a warning; any other error is
still raised (the sweeps of notify, schedules and insights share oz0site.sweeps)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import OperationalError

from insights import tasks as insights_tasks
from notify import tasks as notify_tasks
from schedules import tasks as schedules_tasks


def _away(*args: Any, **kwargs: Any) -> None:
    raise OperationalError("connection failed: connection to server at 127.0.0.1 failed: Connection refused")


@pytest.mark.parametrize(
    "task,module,function",
    [
        (schedules_tasks.fire_due, schedules_tasks.firing, "fire_due"),
        (schedules_tasks.prune, schedules_tasks.retention, "prune"),
        (insights_tasks.sweep_rollouts, insights_tasks.canary, "sweep"),
        (notify_tasks.sweep, notify_tasks.digests, "sweep"),
    ],
)
def test_a_sweep_skips_its_pass_while_the_database_is_away_and_raises_anything_else(
    task: Any, module: Any, function: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(module, function, _away)
    with caplog.at_level(logging.WARNING, logger="oz0site.sweeps"):
        task.run()  # before, OperationalError: the worker logged the task as "raised unexpected"
    assert "skipped: the database is unreachable" in caplog.text
    monkeypatch.setattr(module, function, lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        task.run()
