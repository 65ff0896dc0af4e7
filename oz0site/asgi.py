"""HTTP through Django, websockets through Channels (members only, same origin: scheme, host and port)."""

import os

from oz0site.heap import freeze_startup_heap, load_the_routes, pause_collection_for_startup

pause_collection_for_startup()  # until the application is built and its heap frozen (oz0site/heap.py)

import django  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does, with oz0's handler

from oz0site.web_handler import OneThreadASGIHandler  # noqa: E402

django_asgi_app = OneThreadASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from oz0site import tracing  # noqa: E402
from oz0site.routing import websocket_urlpatterns  # noqa: E402
from oz0site.sockets import SameOriginValidator, session_auth  # noqa: E402
from runs.worker import dispatch  # noqa: E402, F401  (the web process sends: loaded now, not at its first create)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(session_auth(URLRouter(websocket_urlpatterns))),
    }
)

tracing.setup("web")  # when the installer's OTEL_* variables ask for traces (oz0site/tracing.py)
load_the_routes()  # before the freeze: the routes and the API's schemas live as long as the process
freeze_startup_heap()  # the web process's startup objects stay out of full collections
