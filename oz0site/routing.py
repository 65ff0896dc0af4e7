from django.urls import path

from runs.consumers import RunConsumer, WorkspaceConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_id>/", RunConsumer.as_asgi()),
    path("ws/workspaces/<slug:slug>/", WorkspaceConsumer.as_asgi()),
]
