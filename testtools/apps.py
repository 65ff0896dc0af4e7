from django.apps import AppConfig


class TestToolsConfig(AppConfig):
    name = "testtools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The worker's catalog of functions is open to the apps installed beside it; this one
        # exists only where OZ0_TEST_TOOLS=1, so a real install never serves a test tool.
        from runs.worker.tool_functions import serve
        from testtools.functions import FUNCTIONS

        for name, function in FUNCTIONS.items():
            serve(name, function)
