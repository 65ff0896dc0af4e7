import os

from oz0site.heap import freeze_startup_heap, load_the_routes, pause_collection_for_startup

pause_collection_for_startup()  # until the application is built and its heap frozen (oz0site/heap.py)

from django.core.wsgi import get_wsgi_application  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")

application = get_wsgi_application()

from oz0site import tracing  # noqa: E402

tracing.setup("web")  # when the installer's OTEL_* variables ask for traces (oz0site/tracing.py)
load_the_routes()  # before the freeze: the routes and the API's schemas live as long as the process
freeze_startup_heap()  # the web process's startup objects stay out of full collections
