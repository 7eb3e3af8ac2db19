"""Settings for leasebroker, the django-idempotency example project.

Everything that differs between machines comes from the environment (or a ``.env``
file next to ``manage.py``), read with django-environ:

* ``DATABASE_URL``: default SQLite at ``example_project/var/leasebroker.sqlite3``;
  e.g. ``postgres://postgres@127.0.0.1:5432/leasebroker`` for PostgreSQL.
* ``SECRET_KEY``, ``DEBUG`` (default on: this is a demo), ``ALLOWED_HOSTS``.
* ``CELERY_BROKER_URL``: the broker of the Celery worker that relays the outbox and
  sweeps old records (``leasebroker/celery.py``). Default ``filesystem://``: kombu's
  filesystem transport in ``LEASEBROKER_BROKER_DIR`` (default ``var/broker``), so
  worker and beat run with no broker server; ``redis://127.0.0.1:6379/0`` or
  ``amqp://guest:guest@127.0.0.1:5672//`` for a real one.
* ``LEASEBROKER_REBOOT_SECONDS``: how long the fake hypervisor takes to reboot.
* ``LEASEBROKER_BOOT_SECONDS``: how long it takes to boot a new worker (default 0).
* ``LEASEBROKER_CREATE_PHASES``: ``POST /v1/workers`` as three atomic phases
  (default on) or one transaction (the HTTP benchmarks turn it off).
* ``LEASEBROKER_IDEMPOTENCY_LEASE``: the idempotency lease in seconds (default 60);
  the retry-storm demo shortens it to show a crashed request's key taken over.
* ``LEASEBROKER_IDEMPOTENCY_REQUIRED``: default on; off lets the benchmarks send
  unkeyed requests, which then run unprotected (the baseline).
"""

from __future__ import annotations

import sys
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/
REPO_ROOT = BASE_DIR.parent

# Use django_idempotency from this repository even if it is not pip-installed
# (`pip install -e .` at the repo root is the proper way; this keeps the demo working).
if (REPO_ROOT / "django_idempotency").is_dir() and str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    env.read_env(str(BASE_DIR / ".env"))

VAR_DIR = BASE_DIR / "var"
VAR_DIR.mkdir(exist_ok=True)

SECRET_KEY = env("SECRET_KEY", default="leasebroker-demo-only-not-a-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'leasebroker.sqlite3'}")
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Concurrent requests queue on SQLite's single write lock; wait for it, not fail
    # (docs/storage.md#sqlite).
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    if django.VERSION >= (5, 1):
        # Each transaction takes the write lock at its BEGIN, so a view that reads
        # before it writes waits for a concurrent claim instead of failing with
        # "database is locked"; readers keep reading while a view writes (WAL).
        DATABASES["default"]["OPTIONS"].update(
            transaction_mode="IMMEDIATE", init_command="PRAGMA journal_mode=WAL;"
        )

CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    BROKER_DIR = Path(env("LEASEBROKER_BROKER_DIR", default=str(VAR_DIR / "broker")))
    (BROKER_DIR / "processed").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR),
        "data_folder_out": str(BROKER_DIR),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        # The exchange tables; kombu's default is ./control, under whatever the cwd is.
        "control_folder": str(BROKER_DIR / "control"),
    }
CELERY_TASK_IGNORE_RESULT = True
# The fake billing webhook of workers/notifications.py writes here.
LEASEBROKER_NOTIFICATIONS = env(
    "LEASEBROKER_NOTIFICATIONS", default=str(VAR_DIR / "notifications.jsonl")
)
# Where the relay delivers worker.provisioned notices: empty, the fake webhook above;
# a URL (this server's /hooks/billing), over HTTP, signed (workers/billing.py).
LEASEBROKER_BILLING_URL = env("LEASEBROKER_BILLING_URL", default="")
LEASEBROKER_WEBHOOK_SECRET = env(
    "LEASEBROKER_WEBHOOK_SECRET", default="leasebroker-demo-webhook-secret"
)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    # Deliver due outbox messages (the on-commit kick usually got there first).
    "relay-outbox": {"task": "django_idempotency.relay_outbox", "schedule": 10.0},
    # Drop expired idempotency records and sent outbox messages (docs/retention.md).
    "sweep": {"task": "django_idempotency.sweep", "schedule": 3600.0},
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_idempotency",
    "workers",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "leasebroker.urls"
WSGI_APPLICATION = "leasebroker.wsgi.application"
ASGI_APPLICATION = "leasebroker.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",  # Authorization: Token <key>
        "rest_framework.authentication.SessionAuthentication",  # the browsable API
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

IDEMPOTENCY = {
    # A mutating request without an Idempotency-Key header is refused with 400.
    "REQUIRED": env.bool("LEASEBROKER_IDEMPOTENCY_REQUIRED", default=True),
    # Seconds an in-flight request holds its key; a duplicate meanwhile gets 409.
    # Far longer than our slowest handler (a reboot takes LEASEBROKER_REBOOT_SECONDS).
    "LEASE": env.float("LEASEBROKER_IDEMPOTENCY_LEASE", default=60.0),
    # Seconds a finished response is replayed (24 h, as Stripe). Provisioning
    # (POST /v1/workers) keeps its keys for 7 days: see workers/views.py.
    "RETENTION": 24 * 60 * 60.0,
    # Seconds a duplicate waits for the original to finish before answering 409.
    # 0: answer 409 with Retry-After at once (the demo shows it).
    "WAIT": 0.0,
    # The Retry-After value, in seconds, sent with a 409.
    "RETRY_AFTER": 1,
    # Keys are scoped per user: alice's key "k1" and bob's "k1" never collide.
    "PRINCIPAL_RESOLVER": "django_idempotency.principals.user_principal",
    # Besides Content-Type, Location, ETag, ...: our own response headers to replay.
    "REPLAY_HEADERS": ["X-Worker-Id"],
}

# The fake hypervisor (workers/hypervisor.py): seconds one reboot takes.
LEASEBROKER_REBOOT_SECONDS = env.float("LEASEBROKER_REBOOT_SECONDS", default=1.0)
# Seconds one boot of a new worker takes (0: instant).
LEASEBROKER_BOOT_SECONDS = env.float("LEASEBROKER_BOOT_SECONDS", default=0.0)
# POST /v1/workers as three atomic phases (default), or as one transaction.
LEASEBROKER_CREATE_PHASES = env.bool("LEASEBROKER_CREATE_PHASES", default=True)
# The fake hypervisor's own state (workers/hypervisor.py): a SQLite file apart from the
# API's database, as a real hypervisor's state is.
LEASEBROKER_HYPERVISOR_DB = env(
    "LEASEBROKER_HYPERVISOR_DB", default=str(VAR_DIR / "hypervisor.sqlite3")
)
# How long a lease on a worker lasts, and what one renewal adds (seconds).
LEASEBROKER_LEASE_SECONDS = env.int("LEASEBROKER_LEASE_SECONDS", default=24 * 60 * 60)
