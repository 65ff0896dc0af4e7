"""oz0's one settings module, read from the environment.

Every value a deployment changes comes from an environment variable; a bad
value fails loudly at start with the variable's name (see `oz0site.config`).
"""

import ipaddress
import os
from pathlib import Path

import environ

from oz0site import tracing
from oz0site.config import (
    ConfigurationError,
    checked_database_url,
    checked_redis_url,
    dead_peer_options,
    idle_in_transaction_option,
)

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

# Not "daphne": its app only puts daphne behind `manage.py runserver`, which oz0 does not use (the
# web process is `daphne oz0site.asgi:application`), and importing it installs Twisted's reactor in
# every process that sets Django up (each worker, beat, every management command): a quarter of
# a second of CPU at each start, for a server only the web process runs.
INSTALLED_APPS = [
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
    "tenancy",  # workspaces, membership, API tokens (tables runs_workspace, runs_membership, runs_apitoken)
    "runs",
    "oz0agents",  # label `agents`: its tables and migrations keep their names
    "inbox",
    "insights",
    "console",
    "notify",
    "schedules",  # runs started on a clock (issue 33)
    "evals",  # regression cases and the evals that run them (issue 31)
]

MIDDLEWARE = [
    # Traces, only when the installer's OTEL_* variables ask for them (oz0site/tracing.py).
    *(["oz0site.tracing.TracingMiddleware"] if tracing.configured() else []),
    # First: a request's latency for /metrics includes the wait for its workspace's share.
    "oz0site.middleware.RequestMetricsMiddleware",
    "oz0site.web_share.WebShareMiddleware",
    # A JSON API request's server time goes to its workspace's bucket (oz0site/workspace_rate.py).
    "oz0site.workspace_rate.WorkspaceTimeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "oz0site.middleware.RefuseNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A console page renders times in the signed-in person's own time zone (their settings).
    "console.person_settings.PersonTimeZoneMiddleware",
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
# A process gives up on a database host that has answered nothing this long (a cut network, a host
# gone) and connects again, instead of waiting many minutes for TCP to; what DATABASE_URL's own
# query gives (`?keepalives_idle=...`) wins. 0: TCP's own defaults.
DB_DEAD_PEER_SECONDS = env.float("DB_DEAD_PEER_SECONDS", default=30.0)
for _name, _value in dead_peer_options(DB_DEAD_PEER_SECONDS).items():
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(_name, _value)
# The web process (daphne, ASGI) runs views and consumers on many threads: there a pool of
# connections (psycopg_pool, through Django) replaces both persistent connections, which
# Django advises against under ASGI, and a new session per request. `./oz0 up` sets it there.
DB_POOL_SIZE = env.int("DB_POOL_SIZE", default=0)
if DB_POOL_SIZE > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": DB_POOL_SIZE, "timeout": 10}
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", default="test_oz0")}
# Behind PgBouncer in transaction pooling, a server-side cursor (a queryset's .iterator()) would
# outlive the transaction its server connection was lent for. Django's client-side binding
# prepares no statements, and the kernel's advisory locks are transaction-scoped: nothing else to
# change. Migrations connect to PostgreSQL itself (deploy/README.md).
DB_PGBOUNCER = env.bool("DB_PGBOUNCER", default=False)
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = DB_PGBOUNCER

REDIS_URL = checked_redis_url(env.str("REDIS_URL", default=""))

CHANNEL_LAYERS = {
    "default": {
        # Redis pub/sub (see oz0site/channel_layer.py for why, and for its confirmed group_add).
        "BACKEND": "oz0site.channel_layer.ConfirmedPubSubLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL}],
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

# Live sockets (runs/consumers.py, oz0site/sockets.py). The most sockets one person, and one
# signed-in session, may hold open at once (across every web process; a refusal closes with 4429).
OZ0_SOCKETS_PER_USER = env.int("OZ0_SOCKETS_PER_USER", default=50)
OZ0_SOCKETS_PER_SESSION = env.int("OZ0_SOCKETS_PER_SESSION", default=20)
# The Redis connections a web process's sockets share (membership stamps, socket leases); a burst
# larger than the pool waits for a connection, at most OZ0_SOCKET_REDIS_WAIT seconds.
OZ0_SOCKET_REDIS_CONNECTIONS = env.int("OZ0_SOCKET_REDIS_CONNECTIONS", default=20)
OZ0_SOCKET_REDIS_WAIT = env.float("OZ0_SOCKET_REDIS_WAIT", default=5.0)

# Celery: production-shaped by default. acks_late + reject_on_worker_lost put a
# message back when a worker dies mid-task; the kernel's conditional claim makes
# the redelivery harmless. The visibility timeout outlives any task we run.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A list per message priority (0 popped first): runs' priorities (runs.kernel.priorities) map onto them.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("OZ0_VISIBILITY_TIMEOUT", default=6 * 3600),
    "priority_steps": list(range(10)),
    "sep": "\x06\x16",
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env.str("OZ0_QUEUE", default="oz0")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Rounds of agents written in frameworks (F7) are sessions: one waits on people and tool calls
# for as long as they take. They go to a queue of their own, served by a thread-pool worker with
# this many slots (`./oz0 up` starts it), so waiting sessions never hold the slots the engine's
# own rounds, tool calls and sweeps need.
OZ0_SESSION_QUEUE = env.str("OZ0_SESSION_QUEUE", default=f"{CELERY_TASK_DEFAULT_QUEUE}.sessions")
OZ0_SESSION_SLOTS = env.int("OZ0_SESSION_SLOTS", default=16)
# The most of those threads one workspace's sessions hold at once; the rest wait their turn.
OZ0_SESSION_SLOTS_PER_WORKSPACE = env.int("OZ0_SESSION_SLOTS_PER_WORKSPACE", default=8)
# A session waiting on a person (an approval, oz.ask) longer than this is parked when its framework
# can keep its state (Pydantic AI, the Agents SDK): the state is stored, its process ends, and the
# decision resumes it in a new one; parked sessions hold no thread and count against no cap.
OZ0_SESSION_PARK_SECONDS = env.float("OZ0_SESSION_PARK_SECONDS", default=60.0)
# Worker processes `./oz0 up` starts on the main queue, and the most of them one workspace's tool
# calls and model rounds hold at once (a hard cap; default half, at least one): a call over the
# share stays queued in the database and is sent again, behind the others', when one of its
# workspace's workers comes free. Four by default, so one workspace's share (two) still runs two
# parallel branches at once: with a share of one, a join-any's slow branch could take the
# workspace's only worker first and hold its fast sibling behind it.
OZ0_WORKER_CONCURRENCY = env.int("OZ0_WORKER_CONCURRENCY", default=4)
OZ0_WORKER_SLOTS_PER_WORKSPACE = env.int("OZ0_WORKER_SLOTS_PER_WORKSPACE", default=max(1, OZ0_WORKER_CONCURRENCY // 2))
# The run sweeps (expired claims, clocks, lost messages, ...) are no messages: beat runs them in a
# thread of its own every OZ0_SWEEP_SECONDS (runs.worker.periodic.Sweeper), where no call can
# delay them. What beat still sends expires after one period: a message that waited that long
# behind the work is stale, and the next one is on its way.
OZ0_SWEEP_SECONDS = env.float("OZ0_SWEEP_SECONDS", default=2.0)
OZ0_NOTIFY_SWEEP_SECONDS = env.float("OZ0_NOTIFY_SWEEP_SECONDS", default=30.0)
# Schedules (schedules/firing.py): how often due schedules are looked for, and their shortest interval.
OZ0_SCHEDULE_SWEEP_SECONDS = env.float("OZ0_SCHEDULE_SWEEP_SECONDS", default=10.0)
OZ0_SCHEDULE_MIN_INTERVAL_SECONDS = env.int("OZ0_SCHEDULE_MIN_INTERVAL_SECONDS", default=60)
OZ0_ROLLOUT_SWEEP_SECONDS = env.float("OZ0_ROLLOUT_SWEEP_SECONDS", default=60.0)
# Waiting work's deadlines (tenancy/approvers.py, notify/deadlines.py): a pending approval, question
# or hold reminds its owners after OZ0_WAIT_REMINDER_SECONDS and escalates after
# OZ0_WAIT_ESCALATION_SECONDS, unless its workspace sets its own (0: that stage off); the sweep
# looks every OZ0_DEADLINE_SWEEP_SECONDS.
OZ0_WAIT_REMINDER_SECONDS = env.int("OZ0_WAIT_REMINDER_SECONDS", default=3600)
OZ0_WAIT_ESCALATION_SECONDS = env.int("OZ0_WAIT_ESCALATION_SECONDS", default=4 * 3600)
OZ0_DEADLINE_SWEEP_SECONDS = env.float("OZ0_DEADLINE_SWEEP_SECONDS", default=60.0)
if OZ0_WAIT_REMINDER_SECONDS < 0 or OZ0_WAIT_ESCALATION_SECONDS < 0 or OZ0_DEADLINE_SWEEP_SECONDS <= 0:
    raise ConfigurationError(
        "OZ0_WAIT_REMINDER_SECONDS and OZ0_WAIT_ESCALATION_SECONDS must be 0 or more, the sweep's period positive"
    )
# A signed trigger's body (schedules/triggers.py) is refused 413 past this many bytes.
OZ0_TRIGGER_BODY_MAX = env.int("OZ0_TRIGGER_BODY_MAX", default=256 * 1024)
CELERY_BEAT_SCHEDULE = {
    "notify-sweep": {
        "task": "notify.tasks.sweep",
        "schedule": OZ0_NOTIFY_SWEEP_SECONDS,
        "options": {"expires": OZ0_NOTIFY_SWEEP_SECONDS},
    },
    # A firer is safe to run twice at once (a compare-and-set on each schedule's next fire time).
    "schedules-fire": {
        "task": "schedules.tasks.fire_due",
        "schedule": OZ0_SCHEDULE_SWEEP_SECONDS,
        "options": {"expires": OZ0_SCHEDULE_SWEEP_SECONDS},
    },
    # Reminders and escalations of waiting work, each stage of each wait told once (notify.deadlines).
    "deadlines-sweep": {
        "task": "notify.tasks.sweep_deadlines",
        "schedule": OZ0_DEADLINE_SWEEP_SECONDS,
        "options": {"expires": OZ0_DEADLINE_SWEEP_SECONDS},
    },
    # Canaries that fail more than their stable version are rolled back (insights.canary).
    "rollouts-sweep": {
        "task": "insights.tasks.sweep_rollouts",
        "schedule": OZ0_ROLLOUT_SWEEP_SECONDS,
        "options": {"expires": OZ0_ROLLOUT_SWEEP_SECONDS},
    },
}
CELERY_TASK_ALWAYS_EAGER = False
# Celery's Django fixup (celery/fixups/django.py) closes every database connection before and
# after each task unless this is set, whatever CONN_MAX_AGE says: a worker would open a new
# PostgreSQL session per message. Set, the fixup closes them only every this many tasks, and
# oz0site.celery closes old or broken connections around each task as Django does around each
# request (close_old_connections, which honours DB_CONN_MAX_AGE). 0 restores the fixup's habit.
CELERY_DB_REUSE_MAX = env.int("OZ0_CELERY_DB_REUSE_MAX", default=1000)

# Django's own hashers unless OZ0_PASSWORD_HASHERS names others: the test suite (and the processes
# it starts) name a fast one, since its fixtures make thousands of users; a real install never does.
PASSWORD_HASHERS = env.list(
    "OZ0_PASSWORD_HASHERS",
    default=[
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
        "django.contrib.auth.hashers.Argon2PasswordHasher",
        "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
        "django.contrib.auth.hashers.ScryptPasswordHasher",
    ],
)

# The sign-in throttle first: it refuses a throttled (address, name) on every sign-in path (the
# console's, the admin's) before a password is hashed; importing it connects the failure counter
# to `user_login_failed` (oz0site/login.py).
AUTHENTICATION_BACKENDS = ["oz0site.login.ThrottleBackend", "django.contrib.auth.backends.ModelBackend"]

# Single sign-on through the installer's OpenID Connect provider (tenancy/sso.py; README "Single
# sign-on"). On when a client id is set. Every address is the installer's: nothing a workspace
# member sends names a provider. The groups claim maps to workspace roles
# (OZ0_OIDC_GROUP_ROLES: `group=workspace:role`, comma-separated); local passwords may be turned off.
OIDC_RP_CLIENT_ID = env.str("OZ0_OIDC_CLIENT_ID", default="")
OZ0_SSO = bool(OIDC_RP_CLIENT_ID)
OIDC_RP_CLIENT_SECRET = env.str("OZ0_OIDC_CLIENT_SECRET", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT = env.str("OZ0_OIDC_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env.str("OZ0_OIDC_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env.str("OZ0_OIDC_USERINFO_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env.str("OZ0_OIDC_JWKS_ENDPOINT", default="")
OIDC_RP_SIGN_ALGO = env.str("OZ0_OIDC_SIGN_ALGO", default="RS256")
OIDC_RP_SCOPES = env.str("OZ0_OIDC_SCOPES", default="openid email profile groups")
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env.float("OZ0_OIDC_TIMEOUT_SECONDS", default=10.0)
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"
OZ0_OIDC_PROVIDER_NAME = env.str("OZ0_OIDC_PROVIDER_NAME", default="your company's sign-in")
# When set, an ID token from any other issuer is refused.
OZ0_OIDC_ISSUER = env.str("OZ0_OIDC_ISSUER", default="")
OZ0_OIDC_GROUPS_CLAIM = env.str("OZ0_OIDC_GROUPS_CLAIM", default="groups")
OZ0_OIDC_GROUP_ROLES = env.str("OZ0_OIDC_GROUP_ROLES", default="")
OZ0_LOCAL_PASSWORDS = env.bool("OZ0_LOCAL_PASSWORDS", default=True)
if OZ0_SSO:
    AUTHENTICATION_BACKENDS.append("tenancy.sso.SsoBackend")
    if not OZ0_LOCAL_PASSWORDS:
        # No backend checks a password: the console's form, the admin's and any other refuse them.
        AUTHENTICATION_BACKENDS.remove("django.contrib.auth.backends.ModelBackend")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
# A test lane that runs `./oz0 up` (its collectstatic) keeps its files apart from the lanes beside it.
STATIC_ROOT = Path(env.str("OZ0_STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
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
if OZ0_TEST_TOOLS:  # the test.* tools and their ledgers: never on a real install
    INSTALLED_APPS.append("testtools")
# The most /wait requests one user may have open at once (429 `too_many_waits` past it).
OZ0_WAITS_PER_USER = env.int("OZ0_WAITS_PER_USER", default=16)
# The JSON API's bodies: a verb's (everything but a run's create and append, which keep the row
# store's 1 MiB) is refused 413 `payload_too_large` past this many bytes, before it is read.
OZ0_VERB_BODY_MAX = env.int("OZ0_VERB_BODY_MAX", default=64 * 1024)
# Per-user request rates (oz0site/ratelimit.py): writes, and the expensive reads, per window; 0: no limit.
OZ0_RATE_WRITES = env.int("OZ0_RATE_WRITES", default=1200)
OZ0_RATE_READS = env.int("OZ0_RATE_READS", default=1200)
OZ0_RATE_WINDOW_SECONDS = env.float("OZ0_RATE_WINDOW_SECONDS", default=60.0)
# Each workspace's rate (oz0site/workspace_rate.py): the JSON API requests and body bytes all its
# members send together, per second, with a burst saved up; 429 `workspace_rate_limited` past it.
# A rate of 0: no limit. Far above a small team's use: they keep one workspace below a machine's capacity.
OZ0_WORKSPACE_REQUESTS_PER_SECOND = env.float("OZ0_WORKSPACE_REQUESTS_PER_SECOND", default=100.0)
OZ0_WORKSPACE_REQUEST_BURST = env.float("OZ0_WORKSPACE_REQUEST_BURST", default=1000.0)
OZ0_WORKSPACE_BYTES_PER_SECOND = env.float("OZ0_WORKSPACE_BYTES_PER_SECOND", default=float(1024**2))
OZ0_WORKSPACE_BYTE_BURST = env.float("OZ0_WORKSPACE_BYTE_BURST", default=float(32 * 1024**2))
# ...and the server time its requests take per second (CPU seconds of the request threads and the
# queries' time in PostgreSQL). The burst admits any one request (the balance may go below zero);
# it is small so that a workspace's spike holds the machine for seconds, not tens of seconds.
OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND = env.float("OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND", default=0.25)
OZ0_WORKSPACE_WEB_SECONDS_BURST = env.float("OZ0_WORKSPACE_WEB_SECONDS_BURST", default=2.0)
for _name in (
    "OZ0_WORKSPACE_REQUESTS_PER_SECOND",
    "OZ0_WORKSPACE_REQUEST_BURST",
    "OZ0_WORKSPACE_BYTES_PER_SECOND",
    "OZ0_WORKSPACE_BYTE_BURST",
    "OZ0_WORKSPACE_WEB_SECONDS_PER_SECOND",
    "OZ0_WORKSPACE_WEB_SECONDS_BURST",
):
    if globals()[_name] < 0:
        raise ConfigurationError(f"{_name} must be 0 or more")
# A group message reaches a web process's sockets in the group this many at a time, one slice per
# turn of its event loop, so another group's message waits for a slice, not a whole wave
# (oz0site/channel_layer.py); 0: all at once.
OZ0_SOCKET_FAN_OUT_SLICE = env.int("OZ0_SOCKET_FAN_OUT_SLICE", default=16)
# A workspace's pushes in one web process: its group's messages are handed to its sockets at most
# once per (its sockets there / this) seconds, the changes between folded into one (0: no budget).
OZ0_WORKSPACE_PUSHES_PER_SECOND = env.float("OZ0_WORKSPACE_PUSHES_PER_SECOND", default=100.0)
# A workspace that sent more than this many messages to the workers in the current second is busy:
# its messages go at the lowest priority, behind a quiet workspace's (oz0site/workspace_rate.py); 0: off.
OZ0_WORKER_BUSY_MESSAGES_PER_SECOND = env.float("OZ0_WORKER_BUSY_MESSAGES_PER_SECOND", default=20.0)
# Each workspace's share of a web process (oz0site/web_share.py): its requests running at once
# (0: no share); the rest wait their turn, up to the wait, then 503 `workspace_busy`.
OZ0_WEB_SLOTS_PER_WORKSPACE = env.int("OZ0_WEB_SLOTS_PER_WORKSPACE", default=2)
OZ0_WEB_SLOT_WAIT_SECONDS = env.float("OZ0_WEB_SLOT_WAIT_SECONDS", default=30.0)
# A busy workspace's requests running at once in a web process while another workspace used it in
# the last seconds (oz0site/web_share.py); 0, or the share itself: the whole share.
OZ0_WEB_BUSY_SLOTS = env.int("OZ0_WEB_BUSY_SLOTS", default=1)
# While a request of a quiet workspace runs (one whose requests kept little of the web process
# lately), a busy workspace's second or later request waits for it, and one already running pauses
# before its next query, each at most this long over its life (oz0site/web_share.py); 0: no priority.
OZ0_WEB_QUIET_FIRST_SECONDS = env.float("OZ0_WEB_QUIET_FIRST_SECONDS", default=0.25)
# Each workspace's quotas (0: none), refused 429/403 `quota_exceeded` naming the quota: runs not
# finished, tasks one run holds from people's creates and appends, bytes of its runs' stored inputs.
OZ0_QUOTA_ACTIVE_RUNS = env.int("OZ0_QUOTA_ACTIVE_RUNS", default=1000)
OZ0_QUOTA_TASKS_PER_RUN = env.int("OZ0_QUOTA_TASKS_PER_RUN", default=20_000)
OZ0_QUOTA_INPUT_BYTES = env.int("OZ0_QUOTA_INPUT_BYTES", default=10 * 1024**3)
# The longest `test.sleep` (and `test.effect`'s stay): a worker slot is shared by every workspace.
OZ0_TEST_SLEEP_MAX = env.float("OZ0_TEST_SLEEP_MAX", default=60.0)
# A claimed call whose holder has not heartbeaten for this long is presumed dead.
OZ0_LEASE_SECONDS = env.float("OZ0_LEASE_SECONDS", default=30.0)
OZ0_HEARTBEAT_SECONDS = env.float("OZ0_HEARTBEAT_SECONDS", default=1.0)
# A session idle inside a transaction this long is ended by PostgreSQL, which frees its locks: a
# process cut off from the network (or frozen) mid-transaction would otherwise hold its run's row
# lock until TCP gave up on it, hours later, and every sweep, report and click on that run (and
# the sweeper behind it, for every run) would wait. A holder that went quiet for a lease is
# presumed dead anyway; but never sooner than 30 s by default: a process starved of CPU for a few
# seconds (a test stack's short lease on a loaded machine) is slow, not gone, and ending its
# transaction would cost it a retry. 0: never. Behind PgBouncer the startup option is not passed
# on: there `./oz0 manage db_roles` sets it on the app role (oz0site/db_roles.py).
DB_IDLE_IN_TRANSACTION_SECONDS = env.float("DB_IDLE_IN_TRANSACTION_SECONDS", default=max(OZ0_LEASE_SECONDS, 30.0))
if DB_IDLE_IN_TRANSACTION_SECONDS > 0 and not DB_PGBOUNCER:
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options["options"] = idle_in_transaction_option(DB_IDLE_IN_TRANSACTION_SECONDS, str(_options.get("options", "")))
# A ready task whose Celery message never arrived is sent again after this long.
OZ0_REQUEUE_SECONDS = env.float("OZ0_REQUEUE_SECONDS", default=15.0)
# A queued call over its workspace's share gains one priority step per this many seconds waited.
OZ0_PRIORITY_AGING_SECONDS = env.float("OZ0_PRIORITY_AGING_SECONDS", default=30.0)
# Canary rollouts (oz0agents.rollouts): the sweep rolls a canary back when its failure rate passes
# the stable version's by more than the margin, once each has this many finished runs.
OZ0_CANARY_MARGIN = env.float("OZ0_CANARY_MARGIN", default=0.10)
OZ0_CANARY_MIN_RUNS = env.int("OZ0_CANARY_MIN_RUNS", default=20)
OZ0_APPROVAL_PARK_SECONDS = env.float("OZ0_APPROVAL_PARK_SECONDS", default=24 * 3600)
OZ0_PROVIDER_ATTEMPTS = env.int("OZ0_PROVIDER_ATTEMPTS", default=3)
# A tool call's deadline from its claim when neither the task nor the agent's manifest gives one.
OZ0_TOOL_TIMEOUT_SECONDS = env.float("OZ0_TOOL_TIMEOUT_SECONDS", default=15 * 60)
# A harnessed round's deadline from its claim when its manifest's harness gives no timeout_s (F7):
# past it the round ends round_timeout (kind timeout) and its process is killed.
OZ0_ROUND_TIMEOUT_SECONDS = env.float("OZ0_ROUND_TIMEOUT_SECONDS", default=30 * 60)
if OZ0_ROUND_TIMEOUT_SECONDS <= 0:
    raise ConfigurationError("OZ0_ROUND_TIMEOUT_SECONDS must be a positive number of seconds")
# How long a runner tool's call waits when no live executor serves it, before it fails tool_not_served.
OZ0_UNSERVED_SECONDS = env.float("OZ0_UNSERVED_SECONDS", default=60.0)
# Quick tools' ready calls go to workers in chunks of at most this many...
OZ0_QUICK_BATCH = env.int("OZ0_QUICK_BATCH", default=64)
# ...split into at least this many chunks when there are enough, so every worker gets a share.
OZ0_QUICK_SPREAD = env.int("OZ0_QUICK_SPREAD", default=2)
# Delegation's caps (kind `limit`): how deep a tree of child runs goes, how many children one run starts.
OZ0_TREE_MAX_DEPTH = env.int("OZ0_TREE_MAX_DEPTH", default=4)
OZ0_TREE_MAX_CHILDREN = env.int("OZ0_TREE_MAX_CHILDREN", default=16)
# Every worker consuming the default queue stamps this from its main process every quarter of
# OZ0_WORKER_STALE_SECONDS, however busy its slots; /healthz calls the worker stale past that.
OZ0_WORKER_HEARTBEAT_KEY = env.str("OZ0_WORKER_HEARTBEAT_KEY", default=f"oz0:worker-heartbeat:{CELERY_TASK_DEFAULT_QUEUE}")
OZ0_WORKER_STALE_SECONDS = env.float("OZ0_WORKER_STALE_SECONDS", default=30.0)
# Beat's sweeper stamps this at every pass; /healthz calls the sweeps stale past OZ0_WORKER_STALE_SECONDS.
OZ0_SWEEP_HEARTBEAT_KEY = env.str("OZ0_SWEEP_HEARTBEAT_KEY", default=f"oz0:sweep-heartbeat:{CELERY_TASK_DEFAULT_QUEUE}")
# How long a worker keeps trying to claim a message's task or write a call's report while the
# database is unreachable (then the message goes back to the queue, the claim to the lease sweep).
OZ0_DATABASE_RETRY_SECONDS = env.float("OZ0_DATABASE_RETRY_SECONDS", default=600.0)
# How long an Idempotency-Key's first answer is kept (runs/idempotency.py).
OZ0_IDEMPOTENCY_SECONDS = env.float("OZ0_IDEMPOTENCY_SECONDS", default=24 * 3600.0)
# /metrics (oz0site/metrics.py): reached with `Authorization: Bearer <OZ0_METRICS_TOKEN>` or from an
# address of OZ0_METRICS_ADDRESSES (addresses or networks, comma-separated); nobody else (404).
# Processes add what they counted into Redis every OZ0_METRICS_FLUSH_SECONDS (oz0site/metering.py).
OZ0_METRICS_TOKEN = env.str("OZ0_METRICS_TOKEN", default="")
if OZ0_METRICS_TOKEN and len(OZ0_METRICS_TOKEN) < 24:
    raise ConfigurationError("OZ0_METRICS_TOKEN must be at least 24 characters (a long random value)")
OZ0_METRICS_ADDRESSES = env.list("OZ0_METRICS_ADDRESSES", default=[])
try:
    OZ0_METRICS_NETWORKS = [ipaddress.ip_network(a.strip(), strict=False) for a in OZ0_METRICS_ADDRESSES if a.strip()]
except ValueError as error:
    raise ConfigurationError(f"OZ0_METRICS_ADDRESSES: {error}") from None
OZ0_METRICS_FLUSH_SECONDS = env.float("OZ0_METRICS_FLUSH_SECONDS", default=1.0)

# Retention (runs/retention.py): days a finished run's trace (its audit rows with it) and findings are
# kept, for a workspace that sets none of its own (0: for ever); beat prunes every OZ0_PRUNE_SECONDS,
# at most OZ0_PRUNE_BATCH rows per statement.
OZ0_RETENTION_DAYS = env.int("OZ0_RETENTION_DAYS", default=0)
OZ0_PRUNE_SECONDS = env.float("OZ0_PRUNE_SECONDS", default=3600.0)
OZ0_PRUNE_BATCH = env.int("OZ0_PRUNE_BATCH", default=5000)
if OZ0_RETENTION_DAYS < 0 or OZ0_PRUNE_BATCH <= 0 or OZ0_PRUNE_SECONDS <= 0:
    raise ConfigurationError("OZ0_RETENTION_DAYS must be 0 or more, OZ0_PRUNE_BATCH and OZ0_PRUNE_SECONDS positive")
# Firings and trigger deliveries past their workspace's retention (schedules/retention.py): a
# message, since the schedules app is above runs (beat's Pruner thread is the runs app's).
CELERY_BEAT_SCHEDULE["schedules-prune"] = {
    "task": "schedules.tasks.prune",
    "schedule": OZ0_PRUNE_SECONDS,
    "options": {"expires": OZ0_PRUNE_SECONDS},
}

# Agents written in frameworks (F7, docs/harnesses.md): the installer, never a workspace, decides
# what code they run, and each harness process is confined (runs/worker/harness/sandbox.py).
# A YAML file of programs a `jsonl`/`acp` harness may name (`name: [argv...]` or `name: {argv, env}`).
OZ0_HARNESS_PROGRAMS = env.str("OZ0_HARNESS_PROGRAMS", default="")
# Module prefixes a `pydantic_ai`/`openai_agents` target must lie under (comma-separated).
OZ0_HARNESS_MODULES = [m.strip() for m in env.str("OZ0_HARNESS_MODULES", default="").split(",") if m.strip()]
# The shipped examples' programs and modules (oz0agents/examples/); off for a production install.
OZ0_HARNESS_EXAMPLES = env.bool("OZ0_HARNESS_EXAMPLES", default=True)
# Where those modules are found besides the installed packages (os.pathsep-separated folders).
OZ0_AGENT_PATH = [p for p in env.str("OZ0_AGENT_PATH", default="").split(os.pathsep) if p]
# `bwrap`: each harness process in a bubblewrap sandbox (its own mounts and process ids), as
# OZ0_HARNESS_USER when the worker is root; `user`: only switched to OZ0_HARNESS_USER (root workers).
OZ0_HARNESS_SANDBOX = env.str("OZ0_HARNESS_SANDBOX", default="bwrap")
if OZ0_HARNESS_SANDBOX not in ("bwrap", "user"):
    raise ConfigurationError(f"OZ0_HARNESS_SANDBOX must be `bwrap` or `user`, not {OZ0_HARNESS_SANDBOX!r}")
OZ0_HARNESS_USER = env.str("OZ0_HARNESS_USER", default="nobody")
# Each harness process's limits: CPU seconds, writable memory (MiB), processes and threads of the
# harness user at once (RLIMIT_NPROC counts per user: every harness together). 0: no limit.
OZ0_HARNESS_CPU_SECONDS = env.int("OZ0_HARNESS_CPU_SECONDS", default=600)
OZ0_HARNESS_MEMORY_MB = env.int("OZ0_HARNESS_MEMORY_MB", default=4096)
OZ0_HARNESS_PROCESSES = env.int("OZ0_HARNESS_PROCESSES", default=1024)
# Off: a bwrap sandbox gets no network at all (an agent whose model is remote needs it on).
OZ0_HARNESS_NETWORK = env.bool("OZ0_HARNESS_NETWORK", default=True)
# Folders every harness process may write besides its own temporary one (comma-separated).
OZ0_HARNESS_WRITABLE = [p.strip() for p in env.str("OZ0_HARNESS_WRITABLE", default="").split(",") if p.strip()]

# Notifications (notify/): e-mail through Django's backend (the console's by default; SMTP when
# EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend and EMAIL_HOST...); the links in a
# digest start with OZ0_PUBLIC_URL; webhooks to private addresses only when allowed (notify/subscriptions.py).
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=30)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="oz0 <oz0@localhost>")
OZ0_PUBLIC_URL = env.str("OZ0_PUBLIC_URL", default="http://localhost:8000")
OZ0_NOTIFY_PRIVATE_WEBHOOKS = env.bool("OZ0_NOTIFY_PRIVATE_WEBHOOKS", default=False)

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
