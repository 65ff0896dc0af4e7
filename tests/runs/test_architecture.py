"""The kernel owns run state, and side effects wait for commit (STYLE.md 1 and 3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import transaction

ROOT = Path(__file__).resolve().parents[2]


RUN_OR_TASK_STATUS = re.compile(r"\b(run|task|\w+_run|\w+_task)\.status\s*=(?!=)")
QUERYSET_STATUS = re.compile(
    r"\b(Run|Task)\.objects\b.*\.(update|create|bulk_update|get_or_create|update_or_create)\(.*\bstatus\s*="
)


def test_it_assigns_statuses_only_in_the_kernel() -> None:
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith((".venv/", "runs/kernel/", "tests/", "bench/")) or "/migrations/" in relative:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if RUN_OR_TASK_STATUS.search(code) or QUERYSET_STATUS.search(code):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "status written outside runs/kernel:\n" + "\n".join(offenders)


def test_it_would_catch_a_status_written_outside_the_kernel() -> None:
    assert RUN_OR_TASK_STATUS.search("    run.status = 'completed'")
    assert QUERYSET_STATUS.search("Task.objects.filter(pk=1).update(status='failed')")
    assert not RUN_OR_TASK_STATUS.search("    self.http_status = status")


@pytest.mark.django_db
def test_it_fails_a_send_inside_an_open_transaction() -> None:
    from runs.tasks import noop

    with pytest.raises(AssertionError, match="inside an open transaction"), transaction.atomic():
        noop.delay()


@pytest.mark.django_db
def test_it_fails_a_broadcast_inside_an_open_transaction() -> None:
    from oz0site import realtime

    with pytest.raises(AssertionError, match="inside an open transaction"), transaction.atomic():
        realtime.publish(["run.x"], {"type": "run.changed"})
