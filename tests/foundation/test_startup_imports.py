"""What a process that sets Django up imports: only what every oz0 process needs. A web server
(daphne, Twisted) is the web process's alone, and the worker's modules (its tasks, harnesses and
providers' HTTP client) are imported by the processes that send work or do it: a management
command or beat pays neither at its start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runs import kernel

ROOT = Path(__file__).resolve().parents[2]
NOT_AT_SETUP = ("daphne", "twisted.internet.reactor", "runs.worker.dispatch", "runs.worker.tasks", "httpx")


def _loaded_after(code: str) -> list[str]:
    """Which of NOT_AT_SETUP a fresh interpreter holds after `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {NOT_AT_SETUP!r} if m in sys.modules]))\n"
    return json.loads(_last_line(probe))  # type: ignore[no-any-return]


def test_setting_django_up_imports_no_web_server_and_no_worker() -> None:
    assert _loaded_after("import django; django.setup()") == []


def test_the_web_process_loads_the_worker_s_sends_as_it_starts() -> None:
    """Not at its first create: a quarter of a second of imports inside a request would hold every
    other request of the process behind it."""
    loaded = _loaded_after("import oz0site.asgi")
    assert "runs.worker.dispatch" in loaded and "runs.worker.tasks" in loaded
    assert "daphne" not in loaded, "the application module imports no server: daphne imports it"


def test_the_kernel_s_sends_reach_the_worker_queues_through_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    from runs.apps import send_to_the_workers
    from runs.worker import dispatch

    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(dispatch, "send", lambda *args, **kwargs: sent.append((*args, kwargs)))
    previous = kernel.install_sender(None)
    kernel.install_sender(previous)
    assert previous is send_to_the_workers, "RunsConfig.ready installs the sender that imports dispatch"
    send_to_the_workers([1], [[2, 3]], "run-id", [4], priority=7)
    assert sent == [([1], [[2, 3]], "run-id", [4], {"priority": 7})]


WORKER_START = "import django; django.setup(); from oz0site.celery import app; app.loader.import_default_modules()"


def test_a_worker_starts_with_its_tasks_and_without_the_web_s_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery's Django fixup ran every system check at each worker start, importing the whole
    URLconf; `./oz0 up` and every deployment have run them (migrate) before a worker starts."""
    monkeypatch.delenv("CELERY_SKIP_CHECKS", raising=False)
    probe = f"{WORKER_START}\nimport sys\nprint('runs.tasks.execute_task' in app.tasks, 'oz0site.api' in sys.modules)"
    assert _last_line(probe) == "True False"
    monkeypatch.setenv("CELERY_SKIP_CHECKS", "")  # the installer asks for the checks in each worker
    assert _last_line(probe) == "True True"


def _last_line(code: str) -> str:
    """The last line a fresh interpreter prints after running `code` in the project's settings."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "oz0site.settings"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]
