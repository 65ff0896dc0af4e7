from django.contrib import admin
from django.urls import include, path

from oz0site.api import api
from oz0site.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
    path("", include("runs.urls")),
]
