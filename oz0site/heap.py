"""A long-lived process's startup objects, kept out of the garbage collector's full passes.

A full (oldest-generation) collection visits every object the collector tracks. A web or worker
process holds some 150,000 of them from startup alone (Django, the project's modules, settings,
URL and template machinery), alive as long as the process: visiting them is pure cost, 110-140 ms
per full pass on the bench machine. A pass comes when allocation says so, and a kernel
transaction that skips thousands of tasks allocates enough to bring one while it holds its run's
lock: one failing transition over 2,000 descendants took 380 ms with that pass in it and 260
without. Frozen once startup is done, those objects are skipped; a full pass visits what the
process made since (`./oz0 bench --only propagate`: 0-55 ms).

**The routes are startup objects.** Django imports the URL configuration at the first request,
after a web process froze: the JSON API's routers and their schema models, some 47,000 objects,
were in every full collection after it. The web process loads them before it freezes
(`load_the_routes`). In the neighbors bench's web process (one run each, a 2-core machine under
load) a full collection then found 13,000-53,000 objects in the oldest generation, against
53,000-95,000 before, and took 24-84 ms against 52-111 (wall time, the thread's preemption
included).

**Startup without the collector.** While such a process starts, nearly every object it makes
(a module, a class, a model field, a route) lives until it ends, so the collector's passes find
almost nothing; they were a sixth of a Django process's startup CPU (1.25 s against 1.50 s for
`django.setup()` and the URL configuration, side by side). So the web process and the Celery
worker and beat pause the collector first thing and start it again as they freeze: startup's few
cycles are collected by that one pass. A command (`manage.py ...`) keeps the collector running:
nothing would turn it back on in one that never freezes.
"""

from __future__ import annotations

import gc
import sys

# The Celery subcommands whose process freezes once started (oz0site/celery.py's signals).
_FREEZING_CELERY_COMMANDS = frozenset({"worker", "beat"})


def pause_collection_for_startup() -> None:
    """The collector off until freeze_startup_heap() turns it on again: for a process that calls it."""
    gc.disable()


def pause_collection_if_a_celery_worker_or_beat(argv: list[str] | None = None) -> None:
    """Pause the collector when this process is `celery ... worker` or `celery ... beat`, whose
    start signals freeze the heap; any other process importing the Celery app (a command, a test,
    the web process) is left as it is."""
    argv = sys.argv if argv is None else argv
    program = argv[0].replace("\\", "/") if argv else ""
    started_as_celery = program == "celery" or program.endswith(("/celery/__main__.py", "/celery"))
    if started_as_celery and _FREEZING_CELERY_COMMANDS & set(argv[1:]):
        pause_collection_for_startup()


def load_the_routes() -> None:
    """Import the URL configuration and build its resolver's tables now. Django does it at the
    first request, and a web process that froze its heap before then left them (the JSON API's
    routers and their schema models: some 47,000 objects) to every full collection it made."""
    from django.urls import get_resolver

    resolver = get_resolver()
    resolver.url_patterns  # noqa: B018  (imports the URL configuration)
    resolver.reverse_dict  # noqa: B018  (builds the reverse tables)


def freeze_startup_heap() -> int:
    """Collect what startup left as garbage, freeze what lives, and let the collector run again
    (paused or not). Returns the frozen count."""
    gc.collect()
    gc.freeze()
    gc.enable()
    return gc.get_freeze_count()
