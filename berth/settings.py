"""Berth settings, read from the environment (see docs/configuration.md).

Embedded defaults (no DATABASE_URL): SQLite in the data folder, in-memory channel layer,
debug on, a secret key generated once and kept in the data folder.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from berth.env import env_bool, env_choice, env_float, env_int, env_list, env_rate, env_url

# Lets admin and DRF classes be written ModelAdmin[Job] at run time, as the type checker reads them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("BERTH_DATA_DIR", "").strip() or BASE_DIR / "data")

DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
EMBEDDED = DATABASE_URL is None

DEBUG = env_bool("BERTH_DEBUG", default=EMBEDDED)


# Keys that were ever written in Berth's code or docs, and so are known to everyone.
_PUBLIC_KEYS = {"bench", "e2e", "insecure-key-for-tests-only", "change-me", "changeme", "secret"}
MIN_SECRET_KEY_LENGTH = 50


def _secret_key() -> str:
    key = os.environ.get("BERTH_SECRET_KEY", "").strip()
    if key:
        if not DEBUG:
            _refuse_weak_secret_key(key)
        return key
    if not DEBUG:
        raise ImproperlyConfigured("BERTH_SECRET_KEY is required when BERTH_DEBUG is off")
    # Embedded/debug: generate once and keep it, so sessions survive restarts.
    path = DATA_DIR / "secret_key"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def _refuse_weak_secret_key(key: str) -> None:
    """Sessions, CSRF tokens and password resets are signed with it: a guessable key is a
    forgeable login. Same rules as Django's check --deploy (security.W009), enforced."""
    weak = (
        len(key) < MIN_SECRET_KEY_LENGTH
        or len(set(key)) < 5
        or key.startswith("django-insecure")
        or key.lower() in _PUBLIC_KEYS
    )
    if weak:
        raise ImproperlyConfigured(
            f"BERTH_SECRET_KEY is too weak: use at least {MIN_SECRET_KEY_LENGTH} random"
            " characters (python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("BERTH_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("BERTH_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_htmx",
    "template_partials",
    "scheduler",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "berth.web.metrics.HttpMetricsMiddleware",  # first, so it times everything below it
    "scheduler.middleware.refuse_nul_in_urls",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "berth.web.throttle.SignInThrottleMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "berth.web.overload.DatabaseOverloadMiddleware",
]

ROOT_URLCONF = "berth.urls"
ASGI_APPLICATION = "berth.asgi.application"
WSGI_APPLICATION = None

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
    }
]


# Each worker process keeps a pool of at most BERTH_DB_POOL_MAX connections; a request that
# finds none free waits BERTH_DB_POOL_TIMEOUT seconds, then gets 503 + Retry-After (see
# berth/web/overload.py). Django returns a pooled connection at the end of every request, so
# the number a deployment opens is bounded: workers x max + the scheduler's own.
# `./run serve` sets min = max for web workers: each opens its connections at start and keeps
# exactly those, so the count is the same at rest and under load. Elsewhere (the scheduler,
# commands) one is kept and more open only while threads need them, closed again after
# BERTH_DB_POOL_MAX_IDLE seconds.
DB_POOL_MAX = env_int("BERTH_DB_POOL_MAX", 4, minimum=0)
DB_POOL_MIN = env_int("BERTH_DB_POOL_MIN", min(1, DB_POOL_MAX), minimum=0)
DB_POOL_TIMEOUT = env_float("BERTH_DB_POOL_TIMEOUT", 5.0, minimum=0.01)
DB_POOL_MAX_IDLE = env_float("BERTH_DB_POOL_MAX_IDLE", 60.0, minimum=0.1)
# Lets an operator (and the tests) tell Berth's connections apart in pg_stat_activity.
DB_APPLICATION_NAME = os.environ.get("BERTH_DB_APPLICATION_NAME", "").strip() or "berth"
if DB_POOL_MAX and DB_POOL_MIN > DB_POOL_MAX:
    raise ImproperlyConfigured(
        f"BERTH_DB_POOL_MIN={DB_POOL_MIN} is larger than BERTH_DB_POOL_MAX={DB_POOL_MAX}"
    )


def _postgres_options() -> dict[str, Any]:
    options: dict[str, Any] = {"application_name": DB_APPLICATION_NAME[:63]}
    if DB_POOL_MAX:
        # BERTH_DB_POOL_MAX=0: no pool, one connection per request, closed at its end.
        options["pool"] = {
            "min_size": DB_POOL_MIN,
            "max_size": DB_POOL_MAX,
            "timeout": DB_POOL_TIMEOUT,
            "max_idle": DB_POOL_MAX_IDLE,
        }
    return options


def _databases() -> dict[str, Any]:
    if DATABASE_URL is None:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        db: dict[str, Any] = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "berth.sqlite3",
        }
    else:
        # Health checks: a pooled connection is tested as it is handed out, so a database
        # restart costs a reconnect, not one failed request per stale connection.
        db = dict(dj_database_url.parse(DATABASE_URL, conn_max_age=0, conn_health_checks=True))
        if db["ENGINE"] == "django.db.backends.postgresql":
            db["OPTIONS"] = _postgres_options()
    if db["ENGINE"] == "django.db.backends.sqlite3":
        # WAL lets the web server read while the scheduler loop writes; IMMEDIATE takes
        # the write lock at BEGIN so two writers queue instead of failing mid-transaction.
        db["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    # Lets several test runs share one PostgreSQL server without clashing.
    test_name = os.environ.get("BERTH_TEST_DB_NAME", "").strip()
    if test_name:
        db["TEST"] = {"NAME": test_name}
    return {"default": db}


DATABASES = _databases()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    _prefix = os.environ.get("BERTH_CHANNEL_PREFIX", "berth")
    # redis-py 8 reads with a 5 s socket timeout by default, as long as the layer's own
    # blocking pop (5 s): an idle socket's consumer then died with "Timeout reading" now and
    # then. Longer than the pop, still bounded.
    _hosts = [{"address": REDIS_URL, "socket_timeout": 30}]
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": _hosts, "prefix": _prefix},
        },
        # Terminal sessions relay through a layer of their own (dashboard/shell.py): a layer
        # instance pops one Redis key at a time for all of a process's channels, and the held
        # leases' waiter (scheduler/notify.py) blocks there on a channel of another prefix,
        # so keystrokes on the default layer waited for its pop to end (about a second each).
        "shell": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": _hosts, "prefix": f"{_prefix}-shell"},
        },
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"},
                      "shell": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}  # fmt: skip

# Rate limits (sign-in, token creation) count in the cache: shared by every worker process.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "berth.web.cache.SharedRedisCache",  # one client per process
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": os.environ.get("BERTH_CHANNEL_PREFIX", "berth") + "-cache",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Request bodies: larger ones are answered 413 before Django reads them (berth/web/limits.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("BERTH_MAX_BODY_BYTES", 2 * 1024 * 1024, minimum=1024)
# In-flight HTTP requests per worker process; more are answered 503 + Retry-After at once.
# Agents' held lease requests count too (one per node for up to ~12 s), hence the headroom.
BERTH_MAX_INFLIGHT = env_int("BERTH_MAX_INFLIGHT", 1000, minimum=0)
BERTH_RETRY_AFTER_SECONDS = env_int("BERTH_RETRY_AFTER_SECONDS", 1, minimum=1)
# Requests that run Django's middleware and views at once per worker process, each on a
# thread kept for the process's life (berth/web/handler.py); the others wait their turn, first
# come first served, up to BERTH_DB_POOL_TIMEOUT seconds, then get 503 + Retry-After.
# Default: the database pool's size. The agents' threads and the leases' shared threads
# draw on the same pool, so under load a request may still wait for a connection, up to
# BERTH_DB_POOL_TIMEOUT (then 503 + Retry-After).
BERTH_WEB_THREADS = env_int("BERTH_WEB_THREADS", DB_POOL_MAX or 4, minimum=1)
# The agents' requests other than leases (reports, output, registration) wait in a line of
# their own, on these threads: neither kind of traffic queues behind the other's bursts.
BERTH_AGENT_THREADS = env_int("BERTH_AGENT_THREADS", 2, minimum=1)
# POSTs to sign-in-like endpoints per client address (and per username) per window.
BERTH_LOGIN_ATTEMPTS = env_int("BERTH_LOGIN_ATTEMPTS", 10, minimum=1)
BERTH_LOGIN_WINDOW_SECONDS = env_int("BERTH_LOGIN_WINDOW_SECONDS", 60, minimum=1)

# TLS terminated by a reverse proxy that sets X-Forwarded-Proto (see docs/serving.md).
SECURE_PROXY = env_bool("BERTH_SECURE_PROXY", default=False)
if SECURE_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # Load balancers probe health over plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz/?$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("BERTH_HSTS_SECONDS", 365 * 24 * 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("BERTH_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env_bool("BERTH_HSTS_PRELOAD", default=False)
    if not SECURE_HSTS_PRELOAD:
        # Preloading is a promise to browser vendors an operator makes on purpose, not a
        # default: check --deploy would otherwise always warn about it.
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Self-service tokens and DRF authtoken keys (manage.py drf_create_token).
        "scheduler.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "scheduler.api.parsers.JSONParser",
        "scheduler.api.parsers.YAMLParser",
        "scheduler.api.parsers.FormParser",
        "scheduler.api.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "scheduler.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [  # strict: unknown parameters and bad values are 400s
        "scheduler.api.filters.KnownQueryParams",
        "django_filters.rest_framework.DjangoFilterBackend",
        "scheduler.api.filters.StrictOrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "scheduler.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Berth API",
    "DESCRIPTION": "Batch and GPU cluster scheduler",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "scheduler.states.names.JobState",
        "TaskStateEnum": "scheduler.states.names.TaskState",
        "NodeStateEnum": "scheduler.states.names.NodeState",
        "FlowStateEnum": "scheduler.states.names.FlowState",
        "StepStateEnum": "scheduler.states.names.StepState",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "berth": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# Berth's own knobs.
BERTH_JOIN_TOKEN = os.environ.get("BERTH_JOIN_TOKEN", "").strip()
# An agent renews its lease every BERTH_HEARTBEAT_INTERVAL seconds at rest (a lease request
# is held up to 1.25 times that while there is no work for it); a node silent for
# BERTH_HEARTBEAT_TIMEOUT becomes NotReady: by default three missed renewals after a held one.
BERTH_HEARTBEAT_INTERVAL = env_float("BERTH_HEARTBEAT_INTERVAL", 10.0, minimum=0.05)
BERTH_HEARTBEAT_TIMEOUT = env_float(
    "BERTH_HEARTBEAT_TIMEOUT", 4.25 * BERTH_HEARTBEAT_INTERVAL, minimum=0.1
)
if BERTH_HEARTBEAT_TIMEOUT <= 1.25 * BERTH_HEARTBEAT_INTERVAL:
    raise ImproperlyConfigured(
        f"BERTH_HEARTBEAT_TIMEOUT ({BERTH_HEARTBEAT_TIMEOUT:g}) must be longer than a held lease"
        f" (1.25 x BERTH_HEARTBEAT_INTERVAL = {1.25 * BERTH_HEARTBEAT_INTERVAL:g}), or every"
        " node at rest would be declared NotReady"
    )
BERTH_AGENT_MAX_TASKS = env_int("BERTH_AGENT_MAX_TASKS", 10_000, minimum=1)
# The scheduler leader's lock is a lease of this many seconds: a leader frozen or cut off from
# the database that long loses it to a standby (scheduler/cycle/leader.py).
BERTH_LEADER_TIMEOUT = env_float("BERTH_LEADER_TIMEOUT", 15.0, minimum=2.0)
BERTH_KILL_GRACE_SECONDS = env_float("BERTH_KILL_GRACE_SECONDS", 10.0, minimum=0.0)
BERTH_SCHEDULER_INTERVAL = env_float("BERTH_SCHEDULER_INTERVAL", 1.0, minimum=0.01)
# News (a submission, a request, a task that started or ended) wakes the loop before its
# interval is over, but never starts cycles closer together than this (scheduler/cycle/wakeup.py).
BERTH_SCHEDULER_WAKE_GAP = env_float("BERTH_SCHEDULER_WAKE_GAP", 0.2, minimum=0.0)
BERTH_LOG_CHUNK_BYTES = env_int("BERTH_LOG_CHUNK_BYTES", 64 * 1024, minimum=1024)
BERTH_LOG_MAX_BYTES = env_int("BERTH_LOG_MAX_BYTES", 8 * 1024 * 1024, minimum=1024)
BERTH_ARRAY_MAX_ELEMENTS = env_int("BERTH_ARRAY_MAX_ELEMENTS", 100_000, minimum=1)
BERTH_ARRAY_MAX_TASKS = env_int("BERTH_ARRAY_MAX_TASKS", 200_000, minimum=1)

# Notifications (docs/notifications.md): email through Django's mail backend, webhooks only
# to hosts staff allow here (`hooks.slack.com`, `.example.org` for a domain and its
# subdomains); none by default.
BERTH_WEBHOOK_ALLOWED_HOSTS = env_list("BERTH_WEBHOOK_ALLOWED_HOSTS", [])
BERTH_WEBHOOK_TIMEOUT = env_float("BERTH_WEBHOOK_TIMEOUT", 10.0, minimum=0.1)
BERTH_NOTIFY_INTERVAL = env_float("BERTH_NOTIFY_INTERVAL", 2.0, minimum=0.01)
BERTH_NOTIFY_MAX_ATTEMPTS = env_int("BERTH_NOTIFY_MAX_ATTEMPTS", 10, minimum=1)
BERTH_NOTIFY_RETRY_BASE = env_float("BERTH_NOTIFY_RETRY_BASE", 10.0, minimum=0.01)
BERTH_NOTIFY_RETRY_CAP = env_float("BERTH_NOTIFY_RETRY_CAP", 3600.0, minimum=0.01)
BERTH_NOTIFY_LEASE = env_float("BERTH_NOTIFY_LEASE", 120.0, minimum=1.0)
BERTH_NOTIFY_USER_PER_MINUTE = env_int("BERTH_NOTIFY_USER_PER_MINUTE", 20, minimum=1)
EMAIL_HOST = os.environ.get("BERTH_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("BERTH_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = os.environ.get("BERTH_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("BERTH_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("BERTH_EMAIL_TLS", False)
EMAIL_TIMEOUT = env_int("BERTH_EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = os.environ.get("BERTH_EMAIL_FROM", "berth@localhost")
# Start estimates are planned for at most this many waiting jobs per cycle (docs/limits.md).
BERTH_PLAN_DEPTH = env_int("BERTH_PLAN_DEPTH", 500, minimum=0)
BERTH_PLAN_INTERVAL = env_int("BERTH_PLAN_INTERVAL", 10, minimum=0)
# Runtime predictions (EASY++, docs/configuration.md): backfill and start estimates plan each
# job by its owner's last two run times (capped by its walltime) instead of its walltime;
# jobs are still killed only at their walltime. Off by default: planning as before.
BERTH_RUNTIME_PREDICTIONS = env_bool("BERTH_RUNTIME_PREDICTIONS", default=False)
# How a prediction a running job outlived is raised: to its walltime, or stepwise.
BERTH_PREDICTION_CORRECTION = env_choice("BERTH_PREDICTION_CORRECTION", ("walltime", "stepwise"))
# Where fractions of a GPU go (docs/gpus.md): fragmentation gradient descent (measured best
# on Alibaba's GPU trace, docs/gpushare.md), best fit or first fit.
BERTH_GPU_PLACEMENT = env_choice("BERTH_GPU_PLACEMENT", ("fgd", "best-fit", "first-fit"))
# Job priority from named factors (docs/planning.md, docs/configuration.md), as Slurm's
# PriorityWeight*: each factor in [0, 1] times its weight (the job's own priority counts per
# unit). BERTH_PRIORITY_FACTORS=off sets every weight to 0: jobs go by their own priority,
# then age, exactly as before the factors existed.
BERTH_PRIORITY_FACTORS = env_bool("BERTH_PRIORITY_FACTORS", default=True)
BERTH_PRIORITY_WEIGHT_AGE = env_float("BERTH_PRIORITY_WEIGHT_AGE", 1000.0, minimum=0.0)
BERTH_PRIORITY_WEIGHT_FAIRSHARE = env_float("BERTH_PRIORITY_WEIGHT_FAIRSHARE", 10000.0, minimum=0.0)
BERTH_PRIORITY_WEIGHT_JOBSIZE = env_float("BERTH_PRIORITY_WEIGHT_JOBSIZE", 0.0, minimum=0.0)
BERTH_PRIORITY_WEIGHT_QUEUE = env_float("BERTH_PRIORITY_WEIGHT_QUEUE", 0.0, minimum=0.0)
BERTH_PRIORITY_WEIGHT_PRIORITY = env_float("BERTH_PRIORITY_WEIGHT_PRIORITY", 100.0, minimum=0.0)
BERTH_PRIORITY_MAX_AGE = env_float("BERTH_PRIORITY_MAX_AGE", 7 * 86400.0, minimum=1.0)
BERTH_PRIORITY_FAVOR_SMALL = env_bool("BERTH_PRIORITY_FAVOR_SMALL", default=False)
# Fair share's usage: GPU-seconds and core-seconds weighted, halved every half-life seconds
# (0: never), read again at most every BERTH_FAIRSHARE_REFRESH_SECONDS by the scheduler.
BERTH_FAIRSHARE_HALF_LIFE = env_float("BERTH_FAIRSHARE_HALF_LIFE", 7 * 86400.0, minimum=0.0)
BERTH_FAIRSHARE_GPU_WEIGHT = env_float("BERTH_FAIRSHARE_GPU_WEIGHT", 10.0, minimum=0.0)
BERTH_FAIRSHARE_CPU_WEIGHT = env_float("BERTH_FAIRSHARE_CPU_WEIGHT", 1.0, minimum=0.0)
BERTH_FAIRSHARE_DEFAULT_SHARE = env_float("BERTH_FAIRSHARE_DEFAULT_SHARE", 1.0, minimum=0.0)
BERTH_FAIRSHARE_REFRESH_SECONDS = env_float("BERTH_FAIRSHARE_REFRESH_SECONDS", 60.0, minimum=0.0)
# GPU utilisation history (docs/metrics.md): samples older than this are deleted by the
# scheduler loop, and at most one sample per node is kept per BERTH_GPU_SAMPLE_SECONDS (so a
# device holds at most HISTORY / SAMPLE samples, however often its agent renews its lease).
BERTH_GPU_HISTORY_SECONDS = env_int("BERTH_GPU_HISTORY_SECONDS", 24 * 3600, minimum=60)
BERTH_GPU_SAMPLE_SECONDS = env_float("BERTH_GPU_SAMPLE_SECONDS", 5.0, minimum=1.0)
# A running job whose GPU task stays below 1 % for this many minutes is flagged (an event, the
# job's `gpu_idle_since`, berth_jobs_gpu_idle: scheduler/ops/gpu_idle.py); 0 turns it off.
BERTH_GPU_IDLE_MINUTES = env_float("BERTH_GPU_IDLE_MINUTES", 30.0, minimum=0.0)
# An interactive job warned for holding GPUs idle with no terminal input (its queue's
# interactive_gpu_idle_minutes) is ended this many minutes later if still idle
# (scheduler/ops/idle_sessions.py, docs/interactive.md).
BERTH_IDLE_SESSION_GRACE_MINUTES = env_float("BERTH_IDLE_SESSION_GRACE_MINUTES", 10.0, minimum=0.0)
# Token creation (POST /api/v1/tokens/, what `berth login` calls): per address or user.
BERTH_TOKEN_CREATE_RATE = env_rate("BERTH_TOKEN_CREATE_RATE", "20/minute")
# /metrics also answers `Authorization: Bearer <this>` (for Prometheus) when set.
BERTH_METRICS_TOKEN = os.environ.get("BERTH_METRICS_TOKEN", "").strip()

# --- Input limits (docs/limits.md) -----------------------------------------------------------
# Every request body and spec is bounded so that one bad input is a fast 400 for its sender and
# never a slow page, a huge allocation or a crash for everyone else. The request body itself is
# capped by DATA_UPLOAD_MAX_MEMORY_SIZE (413 past it).
BERTH_MAX_INPUT_DEPTH = env_int("BERTH_MAX_INPUT_DEPTH", 64, minimum=8)
BERTH_MAX_TASKS_PER_JOB = env_int("BERTH_MAX_TASKS_PER_JOB", 1024, minimum=1)
BERTH_MAX_FLOW_STEPS = env_int("BERTH_MAX_FLOW_STEPS", 256, minimum=1)
BERTH_MAX_FLOW_ITEMS = env_int("BERTH_MAX_FLOW_ITEMS", 1000, minimum=1)
BERTH_MAX_COMMAND_BYTES = env_int("BERTH_MAX_COMMAND_BYTES", 64 * 1024, minimum=256)
BERTH_MAX_ENV_VARS = env_int("BERTH_MAX_ENV_VARS", 256, minimum=1)
BERTH_MAX_ENV_VALUE_BYTES = env_int("BERTH_MAX_ENV_VALUE_BYTES", 32 * 1024, minimum=256)
BERTH_MAX_LABELS = env_int("BERTH_MAX_LABELS", 64, minimum=1)
BERTH_MAX_LABEL_BYTES = env_int("BERTH_MAX_LABEL_BYTES", 256, minimum=63)
BERTH_MAX_TEXT_BYTES = env_int("BERTH_MAX_TEXT_BYTES", 4096, minimum=256)
BERTH_MAX_PRIORITY = env_int("BERTH_MAX_PRIORITY", 1_000_000, minimum=1)
BERTH_MAX_SECONDS = env_int("BERTH_MAX_SECONDS", 10 * 366 * 24 * 3600, minimum=3600)
# The app proxy (berth/web/appproxy.py, docs/interactive.md#web-apps): seconds to connect to a
# job's app and to wait for each read of its answer; the largest request body and websocket
# message it relays.
BERTH_APP_CONNECT_TIMEOUT = env_float("BERTH_APP_CONNECT_TIMEOUT", 5.0, minimum=0.1)
BERTH_APP_READ_TIMEOUT = env_float("BERTH_APP_READ_TIMEOUT", 120.0, minimum=0.1)
BERTH_APP_MAX_BODY_BYTES = env_int("BERTH_APP_MAX_BODY_BYTES", 1024**3, minimum=1024)
BERTH_APP_MAX_MESSAGE_BYTES = env_int("BERTH_APP_MAX_MESSAGE_BYTES", 16 * 1024**2, minimum=1024)
