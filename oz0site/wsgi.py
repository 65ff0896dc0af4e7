import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")

application = get_wsgi_application()

from oz0site import tracing  # noqa: E402
from oz0site.heap import freeze_startup_heap  # noqa: E402

tracing.setup("web")  # when the installer's OTEL_* variables ask for traces (oz0site/tracing.py)
freeze_startup_heap()  # the web process's startup objects stay out of full collections
