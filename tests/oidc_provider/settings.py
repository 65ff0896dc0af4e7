"""The test provider's own Django project (apart from oz0's: its own database, users and keys)."""

import os

SECRET_KEY = "oz0-test-provider-" + "x" * 40
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
SITE_URL = os.environ["OZ0_TEST_PROVIDER_URL"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oidc_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.oidc_provider.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [os.path.join(os.path.dirname(__file__), "templates")],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["OZ0_TEST_PROVIDER_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "/accounts/login/"
USE_TZ = True
OIDC_USERINFO = "tests.oidc_provider.claims.userinfo"
OIDC_EXTRA_SCOPE_CLAIMS = "tests.oidc_provider.claims.GroupsClaims"
# On loopback it shares oz0's host: cookies are per host, not per port, so its own names keep
# its session from replacing oz0's (where the sign-in's state waits).
SESSION_COOKIE_NAME = "idp_sessionid"
CSRF_COOKIE_NAME = "idp_csrftoken"
