"""The kernel's sends to the workers (the port `runs.kernel.install_sender` takes; RunsConfig.ready installs it)."""

from __future__ import annotations

from django.conf import settings

from oz0site import workspace_rate
from runs import kernel
from runs.selectors import workspace_of
from runs.worker.tasks import execute_batch, execute_session, execute_task


def send(task_ids: list[int], chunks: list[list[int]], run_id: str | None, sessions: list[int], priority: int = 5) -> None:
    """The kernel's sends, after its commit: one message per task, one per chunk of quick calls,
    one per session on the session workers' queue (see kernel.Sender), each with its run's
    priority (Redis pops a lower message priority first: the inverse of it), unless its workspace
    is busy: then behind a quiet workspace's (oz0site.workspace_rate.worker_priority)."""
    at = workspace_rate.worker_priority(
        workspace_of(run_id), len(task_ids) + len(chunks) + len(sessions), kernel.message_priority(priority)
    )
    for task_id in task_ids:
        execute_task.apply_async((task_id, run_id), priority=at)
    for chunk in chunks:
        execute_batch.apply_async((chunk, run_id), priority=at)
    for task_id in sessions:
        execute_session.apply_async((task_id, run_id), queue=settings.OZ0_SESSION_QUEUE, priority=at)
