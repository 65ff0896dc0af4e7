from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from oz0site.api import api
from oz0site.health import healthz
from oz0site.login import ThrottledLoginView
from oz0site.metrics import metrics
from tenancy import sso

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("oidc/authenticate/", sso.SignInView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", sso.CallbackView.as_view(), name="oidc_authentication_callback"),
    path("", include("console.urls")),
    path("", include("notify.urls")),
]

# A database that cannot be reached answers 503 with Retry-After (oz0site/errors.py), not a 500.
handler500 = "oz0site.errors.server_error"
