"""Settings of the minimal-view benchmark's server (benchmarks/minimal_view.py).

The smallest view that does real work: DRF, header-token authentication, a serializer,
one INSERT in ``transaction.atomic()``. Keys are optional (``REQUIRED: False``), so an
unkeyed request runs the same view unprotected: the baseline.
"""

from __future__ import annotations

import environ

env = environ.Env()

SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "minimal_app.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": env.db("DATABASE_URL")}
DATABASES["default"]["CONN_MAX_AGE"] = 300
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "rest_framework.authtoken",
    "django_idempotency",
    "minimal_app",
]
MIDDLEWARE: list[str] = []
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
}
IDEMPOTENCY = {
    "REQUIRED": False,
    "OUTBOX_KICK": False,
    # BENCH_PARTITIONED=false: the plain table (docs/retention.md), for comparison.
    "PARTITION_RECORDS": env.bool("BENCH_PARTITIONED", default=True),
    # BENCH_OWNER_PRESENCE=false: the lease alone (docs/robustness.md#owner-presence).
    "OWNER_PRESENCE": env.bool("BENCH_OWNER_PRESENCE", default=True),
}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
