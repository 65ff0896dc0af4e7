"""The worker side's seams: Celery task names outlive the move, and the tool catalog runs nothing."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests.conftest import ROOT

# The names queued messages and the beat schedule carry; they stay when the code moves.
TASK_NAMES = {"runs.tasks.execute_task", "runs.tasks.execute_batch", "runs.tasks.sweep", "runs.tasks.noop"}
# The notify app's (notify/tasks.py): beat runs its sweep, which queues digest deliveries.
NOTIFY_TASK_NAMES = {"notify.tasks.sweep", "notify.tasks.deliver_digest"}


def test_it_keeps_the_task_names_messages_and_beat_carry(settings: Any) -> None:
    from oz0site.celery import app

    app.loader.import_default_modules()  # what a worker does at start: the autodiscovery
    assert {name: app.tasks[name].__module__ for name in TASK_NAMES} == dict.fromkeys(TASK_NAMES, "runs.worker.tasks")
    assert {name: app.tasks[name].__module__ for name in NOTIFY_TASK_NAMES} == dict.fromkeys(NOTIFY_TASK_NAMES, "notify.tasks")
    assert {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()} <= TASK_NAMES | NOTIFY_TASK_NAMES


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
