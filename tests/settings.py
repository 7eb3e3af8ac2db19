"""Settings for the test suite. The database comes from DATABASE_URL (django-environ):
unset means SQLite; ``postgres://postgres@127.0.0.1:5432/postgres`` runs on PostgreSQL."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

import environ

env = environ.Env()

# The on-commit kick (docs/outbox.md) publishes only to a Celery app a test sets up
# itself: Celery's default app would read a developer's broker from the environment
# and send the suite's kicks to that developer's workers.
for _name in ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL"):
    os.environ.pop(_name, None)

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.support.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": env.db("DATABASE_URL", default="sqlite:///:memory:")}
# One test database per checkout, so two checkouts can run their suites at once.
_checkout = hashlib.sha256(str(Path(__file__).resolve().parent).encode()).hexdigest()[:12]
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["TEST"] = {
        "NAME": env("PG_TEST_NAME", default=f"test_django_idempotency_{_checkout}")
    }
    # A second real database on the same server, for the read-replica tests
    # (tests/store/test_replica_router.py): created only when a collected test asks for it.
    DATABASES["replica"] = {
        **DATABASES["default"],
        "TEST": {"NAME": f"{DATABASES['default']['TEST']['NAME']}_replica"},
    }
    # Another primary, for records kept apart from the views' rows, tenant shards and
    # writes to the wrong database (tests/store/test_routing.py).
    DATABASES["shard"] = {
        **DATABASES["default"],
        "TEST": {"NAME": f"{DATABASES['default']['TEST']['NAME']}_shard"},
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not :memory:, so that threads in concurrency tests share one database.
    _default_path = Path(tempfile.gettempdir()) / f"django_idempotency_test_{_checkout}.sqlite3"
    DATABASES["default"]["TEST"] = {"NAME": env("SQLITE_TEST_PATH", default=str(_default_path))}
    DATABASES["default"]["OPTIONS"] = {"timeout": 30}
    DATABASES["shard"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(_default_path.with_suffix(".shard.sqlite3")),
        "TEST": {"NAME": str(_default_path.with_suffix(".shard.sqlite3"))},
        "OPTIONS": {"timeout": 30},
    }

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "rest_framework.authtoken",
    "django_idempotency",
    "tests.support.testapp",
]
# Where django-celery-beat supports the Django under test (the Makefile installs it
# only there): the periodic tasks' tests (tests/contrib/test_celery_beat.py).
# A test that hides Celery (the app without it) hides django-celery-beat with it.
if all(importlib.util.find_spec(name) is not None for name in ("celery", "django_celery_beat")):
    INSTALLED_APPS.append("django_celery_beat")
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
