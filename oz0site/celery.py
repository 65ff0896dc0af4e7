import os
from typing import Any

from celery import Celery, signals
from django.db import close_old_connections

from oz0site.heap import freeze_startup_heap, pause_collection_if_a_celery_worker_or_beat

pause_collection_if_a_celery_worker_or_beat()  # until its start signal freezes the heap (oz0site/heap.py)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")
# Celery's Django fixup runs every system check as a worker starts, which imports the whole
# URLconf (the JSON API's schemas): 0.6 s of CPU at each start and restart. Every way oz0 starts
# its workers has run them already: `./oz0 up` migrates first, and so does every deployment in
# deploy/ (migrate runs the checks). An installer who wants them in each worker too sets it empty.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("oz0")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The Celery adapters live in runs/worker/tasks.py (not in an app's tasks.py). Their task names
# stay `runs.tasks.*`, the names queued messages and the beat schedule carry. notify/tasks.py: digests.
app.autodiscover_tasks(["runs.worker", "notify", "schedules", "insights"])


@signals.task_prerun.connect
@signals.task_postrun.connect
def close_obsolete_connections(sender: Any = None, **kwargs: Any) -> None:
    """Around each task, as Django around each request: drop a connection past DB_CONN_MAX_AGE or
    left unusable (the fixup no longer closes them every task, see CELERY_DB_REUSE_MAX). An eager
    task runs inside its caller's transaction, whose connection is not ours to close."""
    if sender is not None and getattr(sender.request, "is_eager", False):
        return
    close_old_connections()


@signals.worker_init.connect
def trace_the_worker(**kwargs: Any) -> None:
    """Traces on when the installer's OTEL_* variables ask for them (oz0site/tracing.py); a prefork
    child inherits the set-up, and the SDK starts its export thread again after the fork."""
    from oz0site import tracing

    tracing.setup("worker")


@signals.worker_init.connect
@signals.worker_process_init.connect
def freeze_the_startup_heap(**kwargs: Any) -> None:
    """Once the worker has loaded its tasks (in the parent, so prefork children share the frozen
    pages) and again in each child after its own start (oz0site/heap.py says why)."""
    freeze_startup_heap()


@signals.worker_init.connect
@signals.worker_process_init.connect
def name_the_database_sessions(**kwargs: Any) -> None:
    """A worker's sessions carry its `host:pid`, the name its claims carry, so the lease sweep can
    free the locks of one frozen inside a transaction (runs/kernel/holder_sessions.py)."""
    from django.db.backends.signals import connection_created

    from runs.worker.execution import name_database_session

    connection_created.connect(name_database_session, dispatch_uid="oz0-name-the-database-sessions")


@signals.worker_shutting_down.connect
def park_the_sessions_waiting_on_people(**kwargs: Any) -> None:
    """A session worker told to stop parks its framework sessions that wait on a person
    (runs/worker/harness/base.py `worker_stopping`), so its warm shutdown is not held up by them."""
    from runs.worker.harness.base import worker_stopping

    worker_stopping.set()


@signals.beat_init.connect
def start_the_sweeper(sender: Any = None, **kwargs: Any) -> None:
    """Beat runs the run sweeps itself, in a thread, and retention in another (runs/worker/periodic.py says why)."""
    import django

    django.setup()
    from oz0site import tracing
    from runs.worker.periodic import Pruner, Sweeper

    tracing.setup("beat")

    Sweeper().start()
    Pruner().start()
    freeze_startup_heap()  # beat lives as long as a worker (oz0site/heap.py says why)


@signals.worker_ready.connect
def start_proving_the_worker_alive(sender: Any = None, **kwargs: Any) -> None:
    """A worker of the default queue stamps the heartbeat /healthz reads, from its main process."""
    from django.conf import settings

    from runs.worker.periodic import WorkerAlive

    consumed = set(getattr(getattr(sender, "app", app).amqp.queues, "consume_from", None) or ())
    if not consumed or settings.CELERY_TASK_DEFAULT_QUEUE in consumed:
        WorkerAlive().start()
