"""Long-lived processes freeze their startup objects out of the collector's full passes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest
from celery import signals

from oz0site import celery as celery_setup
from oz0site.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


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
    probe = f"import gc, {module}; print(gc.get_freeze_count())"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "oz0site.settings", "DEBUG": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert int(done.stdout.strip()) > 10_000  # Django's and oz0's startup objects, not a handful
