from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from oz0site.sockets import session_signed_out
        from runs import kernel
        from runs.worker import dispatch

        # A session that signs out closes its live sockets (membership stamps: TenancyConfig.ready).
        user_logged_out.connect(session_signed_out, dispatch_uid="oz0-sockets-signed-out")

        # The kernel does not import Celery: it sends ready work through this port.
        kernel.install_sender(dispatch.send)
