"""Long-lived processes freeze their startup objects out of the collector's full passes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import signals

from oz0site import celery as celery_setup
from oz0site.heap import (
    freeze_startup_heap,
    pause_collection_for_startup,
    pause_collection_if_a_celery_worker_or_beat,
)

HARNESS = Path(__file__).resolve().parents[2] / "runs" / "worker" / "harness"


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def thawed() -> Iterator[None]:
    """Nothing frozen while the test runs; the session's heap frozen again after it (tests/conftest.py)."""
    gc.unfreeze()
    yield
    gc.unfreeze()
    freeze_startup_heap()


def test_it_collects_startup_garbage_then_freezes_what_lives(thawed: None) -> None:
    alive = Node()
    garbage = Node()
    garbage_ref = weakref.ref(garbage)
    del garbage
    frozen = freeze_startup_heap()
    assert garbage_ref() is None, "startup's garbage was frozen, not collected"
    # What it froze may die afterwards (another thread of the process, xdist's among them, drops
    # a reference), never grow: nothing is frozen but by the call.
    assert 0 < gc.get_freeze_count() <= frozen
    # A frozen object is out of every generation: no collection visits it again.
    assert not any(o is alive for o in gc.get_objects())
    later = Node()
    assert any(o is later for o in gc.get_objects()), "what the process makes afterwards is collected as usual"


def _receivers(signal: object) -> list[object]:
    return [ref() for _, ref in signal.receivers]  # type: ignore[attr-defined]


def test_a_worker_freezes_once_started_in_the_parent_and_in_each_child(thawed: None) -> None:
    for signal in (signals.worker_init, signals.worker_process_init):
        assert celery_setup.freeze_the_startup_heap in _receivers(signal)
    celery_setup.freeze_the_startup_heap()
    assert gc.get_freeze_count() > 0


@pytest.mark.parametrize("module", ["oz0site.asgi", "oz0site.wsgi"])
def test_a_web_process_freezes_once_its_application_is_built(module: str) -> None:
    # The probe's first import is the module: it paused the collector itself, and turned it on again.
    # The routes (the URL configuration, the JSON API's routers and their schema models) are
    # startup objects too: built at the first request, they were in every full collection after it.
    probe = (
        f"import gc, {module}; from django.urls import get_resolver; from oz0site.api import api; "
        "routes = get_resolver().url_patterns; young = {id(o) for o in gc.get_objects()}; "
        "print(gc.get_freeze_count(), gc.isenabled(), id(routes) in young, id(api) in young)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "oz0site.settings", "DEBUG": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120, check=True)
    frozen, collecting, routes_collected, api_collected = done.stdout.split()
    assert int(frozen) > 10_000  # Django's and oz0's startup objects, not a handful
    assert collecting == "True", "the collector stayed off after startup"
    assert (routes_collected, api_collected) == ("False", "False")


@pytest.fixture
def collector_restored() -> Iterator[None]:
    yield
    gc.enable()


@pytest.mark.parametrize(
    ("argv", "paused"),
    [
        (["/venv/lib/python3.11/site-packages/celery/__main__.py", "-A", "oz0site", "worker", "-Q", "oz0"], True),
        (["/venv/bin/celery", "-A", "oz0site", "beat", "-s", "/data/celerybeat-schedule"], True),
        (["celery", "-A", "oz0site", "worker"], True),
        (["/venv/bin/celery", "-A", "oz0site", "inspect", "ping"], False),  # a short command: never freezes
        (["manage.py", "runner", "--url", "http://127.0.0.1:8000"], False),
        (["/venv/bin/pytest", "tests/worker"], False),
        (["manage.py", "worker"], False),
        ([], False),
    ],
)
def test_only_a_celery_worker_or_beat_starts_with_the_collector_paused(
    collector_restored: None, argv: list[str], paused: bool
) -> None:
    gc.enable()
    pause_collection_if_a_celery_worker_or_beat(argv)
    assert gc.isenabled() is not paused


def test_freezing_turns_a_paused_collector_on_again(thawed: None, collector_restored: None) -> None:
    pause_collection_for_startup()
    assert not gc.isenabled()
    assert freeze_startup_heap() > 0
    assert gc.isenabled()


def test_beat_freezes_once_its_sweeps_are_started(
    thawed: None, collector_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runs.worker import periodic

    started: list[str] = []
    monkeypatch.setattr(periodic.Sweeper, "start", lambda self: started.append("sweeper"))
    monkeypatch.setattr(periodic.Pruner, "start", lambda self: started.append("pruner"))
    monkeypatch.setattr("oz0site.tracing.setup", lambda role: None)
    assert celery_setup.start_the_sweeper in _receivers(signals.beat_init)
    pause_collection_for_startup()
    celery_setup.start_the_sweeper()
    assert started == ["sweeper", "pruner"]
    assert gc.isenabled() and gc.get_freeze_count() > 0


PROBE_AGENTS = {
    "pydantic_ai": (
        "pydantic_ai_bridge",
        "from pydantic_ai import Agent\nfrom pydantic_ai.models.test import TestModel\nagent = Agent(TestModel())\n",
    ),
    "openai_agents": ("openai_agents_bridge", "from agents import Agent\nagent = Agent(name='probe')\n"),
}


@pytest.mark.parametrize("framework", sorted(PROBE_AGENTS))
def test_a_framework_bridge_loads_its_agent_with_the_collector_paused_then_frozen(framework: str, tmp_path: Path) -> None:
    bridge, agent_source = PROBE_AGENTS[framework]
    (tmp_path / "probe_agent.py").write_text("import gc\nCOLLECTING_WHILE_LOADED = gc.isenabled()\n" + agent_source)
    probe = (
        f"import gc, sys; sys.path[:0] = [{str(HARNESS)!r}, {str(tmp_path)!r}]; import {bridge} as bridge\n"
        "bridge.load('probe_agent:agent'); import probe_agent\n"
        # The bridge keeps its standard output for the protocol: the answer goes to a file.
        f"open({str(tmp_path / 'seen')!r}, 'w').write("
        "f'{probe_agent.COLLECTING_WHILE_LOADED} {gc.isenabled()} {gc.get_freeze_count()}')"
    )
    subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    while_loaded, afterwards, frozen = (tmp_path / "seen").read_text().split()
    assert (while_loaded, afterwards) == ("False", "True")
    assert int(frozen) > 10_000  # the framework's classes, frozen out of later passes
