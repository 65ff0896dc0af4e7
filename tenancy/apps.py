from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import post_delete, post_save

        from tenancy import membership
        from tenancy.models import Membership

        # Live sockets re-check membership when a user's stamp moved (runs.consumers).
        for signal in (post_save, post_delete):
            signal.connect(membership.membership_changed, sender=Membership, dispatch_uid=f"oz0-membership-{signal}")
            signal.connect(membership.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid=f"oz0-user-{signal}")
        if settings.OZ0_SSO:
            from tenancy.sso import check_configuration

            check_configuration()  # the installer's mistake stops every process at its start
