"""HTTP through Django, websockets through Channels (members only, same origin: scheme, host and port)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from oz0site import tracing  # noqa: E402
from oz0site.heap import freeze_startup_heap  # noqa: E402
from oz0site.routing import websocket_urlpatterns  # noqa: E402
from oz0site.sockets import SameOriginValidator, session_auth  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(session_auth(URLRouter(websocket_urlpatterns))),
    }
)

tracing.setup("web")  # when the installer's OTEL_* variables ask for traces (oz0site/tracing.py)
freeze_startup_heap()  # the web process's startup objects stay out of full collections
