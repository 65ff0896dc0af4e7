from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.contrib.auth.signals import user_logged_out

        from oz0site.sockets import session_signed_out
        from runs import kernel
        from runs.worker.tasks import execute_batch, execute_session, execute_task

        # A session that signs out closes its live sockets (membership stamps: TenancyConfig.ready).
        user_logged_out.connect(session_signed_out, dispatch_uid="oz0-sockets-signed-out")

        def send(
            task_ids: list[int], chunks: list[list[int]], run_id: str | None, sessions: list[int], priority: int = 5
        ) -> None:
            """The kernel's sends, after its commit: one message per task, one per chunk of quick
            calls, one per session on the session workers' queue (see kernel.Sender), each with
            its run's priority (Redis pops a lower message priority first: the inverse of it)."""
            at = kernel.message_priority(priority)
            for task_id in task_ids:
                execute_task.apply_async((task_id, run_id), priority=at)
            for chunk in chunks:
                execute_batch.apply_async((chunk, run_id), priority=at)
            for task_id in sessions:
                execute_session.apply_async((task_id, run_id), queue=settings.OZ0_SESSION_QUEUE, priority=at)

        # The kernel does not import Celery: it sends ready work through this port.
        kernel.install_sender(send)
