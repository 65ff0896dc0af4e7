from typing import Any

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from oz0site.sockets import session_signed_out
        from runs import kernel

        # A session that signs out closes its live sockets (membership stamps: TenancyConfig.ready).
        user_logged_out.connect(session_signed_out, dispatch_uid="oz0-sockets-signed-out")

        # The kernel does not import Celery: it sends ready work through this port.
        kernel.install_sender(send_to_the_workers)


def send_to_the_workers(*args: Any, **kwargs: Any) -> None:
    """The kernel's sends (runs.worker.dispatch), whose module is imported at the first send: it
    brings the whole worker (its tasks, the harnesses, the providers' HTTP client), a quarter of
    a second of CPU that a process that never sends (a management command, beat) need not pay
    at its start. The web process imports it as it starts (oz0site/asgi.py); a worker with its
    tasks."""
    from runs.worker import dispatch

    dispatch.send(*args, **kwargs)
