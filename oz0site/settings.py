"""oz0's one settings module, read from the environment.

Every value a deployment changes comes from an environment variable; a bad
value fails loudly at start with the variable's name (see `oz0site.config`).
"""

from pathlib import Path

import environ

from oz0site.config import ConfigurationError, checked_database_url, checked_redis_url

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
# Production (DEBUG off) needs a real key; `./oz0` makes one per install under OZ0_DATA_DIR.
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ConfigurationError("SECRET_KEY is not set: production (DEBUG=0) needs a long random SECRET_KEY")
    SECRET_KEY = "oz0-development-only-secret-key-change-me-in-production-0123456789"
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    # Only for its static files and templates: the API docs' Swagger UI, served from this install.
    "ninja",
    "django_htmx",
    "template_partials",
    "runs",
    "inbox",
    "insights",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "oz0site.middleware.RefuseNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "oz0site.middleware.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "oz0site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "oz0site.wsgi.application"
ASGI_APPLICATION = "oz0site.asgi.application"

DATABASE_URL = checked_database_url(env.str("DATABASE_URL", default=""))
DATABASES = {"default": environ.Env.db_url_config(DATABASE_URL)}
# Persistent connections: a Celery worker runs thousands of short kernel transactions, and
# opening a PostgreSQL session for each (a backend fork) would cost more than the work.
# Health checks drop a connection the server closed instead of failing the next task.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=300)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", default="test_oz0")}

REDIS_URL = checked_redis_url(env.str("REDIS_URL", default=""))

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py's async pool stops at 100 connections by default; a console with many open
        # pages joins groups concurrently, so allow more (OZ0_CHANNEL_CONNECTIONS).
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "max_connections": env.int("OZ0_CHANNEL_CONNECTIONS", default=1000)}],
            "prefix": env.str("OZ0_CHANNEL_PREFIX", default="oz0"),
        },
    }
}

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "oz0",
    }
}

# Celery: production-shaped by default. acks_late + reject_on_worker_lost put a
# message back when a worker dies mid-task; the kernel's conditional claim makes
# the redelivery harmless. The visibility timeout outlives any task we run.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("OZ0_VISIBILITY_TIMEOUT", default=6 * 3600)}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env.str("OZ0_QUEUE", default="oz0")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "runs.tasks.sweep", "schedule": env.float("OZ0_SWEEP_SECONDS", default=2.0)},
    "worker-heartbeat": {"task": "runs.tasks.noop", "schedule": 60.0},
}
CELERY_TASK_ALWAYS_EAGER = False

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# Production hardening: on unless DEBUG, each overridable for a TLS-terminating proxy.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
# X-Forwarded-Proto is believed only behind a proxy that sets it (and strips a client's own):
# without one, any client could claim HTTPS.
OZ0_BEHIND_PROXY = env.bool("OZ0_BEHIND_PROXY", default=False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if OZ0_BEHIND_PROXY else None
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# oz0's own knobs.
OZ0_TEST_TOOLS = env.bool("OZ0_TEST_TOOLS", default=False)
# The most /wait requests one user may have open at once (429 `too_many_waits` past it).
OZ0_WAITS_PER_USER = env.int("OZ0_WAITS_PER_USER", default=16)
# The longest `test.sleep` (and `test.effect`'s stay): a worker slot is shared by every workspace.
OZ0_TEST_SLEEP_MAX = env.float("OZ0_TEST_SLEEP_MAX", default=60.0)
# A claimed call whose holder has not heartbeaten for this long is presumed dead.
OZ0_LEASE_SECONDS = env.float("OZ0_LEASE_SECONDS", default=30.0)
OZ0_HEARTBEAT_SECONDS = env.float("OZ0_HEARTBEAT_SECONDS", default=1.0)
# A ready task whose Celery message never arrived is sent again after this long.
OZ0_REQUEUE_SECONDS = env.float("OZ0_REQUEUE_SECONDS", default=15.0)
OZ0_APPROVAL_PARK_SECONDS = env.float("OZ0_APPROVAL_PARK_SECONDS", default=24 * 3600)
OZ0_PROVIDER_ATTEMPTS = env.int("OZ0_PROVIDER_ATTEMPTS", default=3)
# A tool call's deadline from its claim when neither the task nor the agent's manifest gives one.
OZ0_TOOL_TIMEOUT_SECONDS = env.float("OZ0_TOOL_TIMEOUT_SECONDS", default=15 * 60)
# How long a runner tool's call waits when no live executor serves it, before it fails tool_not_served.
OZ0_UNSERVED_SECONDS = env.float("OZ0_UNSERVED_SECONDS", default=60.0)
# Quick tools' ready calls go to workers in chunks of at most this many...
OZ0_QUICK_BATCH = env.int("OZ0_QUICK_BATCH", default=16)
# ...split into at least this many chunks when there are enough, so every worker gets a share.
OZ0_QUICK_SPREAD = env.int("OZ0_QUICK_SPREAD", default=4)
# Beat's sweep, run by a worker of the default queue, stamps this; /healthz reads it.
OZ0_WORKER_HEARTBEAT_KEY = env.str("OZ0_WORKER_HEARTBEAT_KEY", default=f"oz0:worker-heartbeat:{CELERY_TASK_DEFAULT_QUEUE}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING"}},
}

# Model providers by route prefix (`openai:gpt-4o-mini` → the `openai` entry): base_url, api_key,
# and optionally api (openai|anthropic, for an entry named otherwise), timeout, max_tokens.
OZ0_PROVIDERS = env.json(
    "OZ0_PROVIDERS",
    default={
        "openai": {
            "api": "openai",
            "base_url": env.str("OPENAI_BASE_URL", default="https://api.openai.com/v1"),
            "api_key": env.str("OPENAI_API_KEY", default=""),
        },
        "anthropic": {
            "api": "anthropic",
            "base_url": env.str("ANTHROPIC_BASE_URL", default="https://api.anthropic.com/v1"),
            "api_key": env.str("ANTHROPIC_API_KEY", default=""),
        },
    },
)
