"""Settings of the schema-per-tenant suite (django-tenants; tests/integration/test_tenants.py).

One PostgreSQL database, one schema per tenant: the app is in ``TENANT_APPS``, so each
tenant's schema has its own records and outbox. ``TENANTS_LAYOUT=both`` puts it in
``SHARED_APPS`` too, so ``public`` has tables of its own (docs/tenants.md); the suite
runs once per layout. The database comes from DATABASE_URL (PostgreSQL only); its name
is per checkout and layout, like the main suite's test database.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import environ

env = environ.Env()

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

#: ``"tenant"``: the app in ``TENANT_APPS`` only; ``"both"``: in ``SHARED_APPS`` too.
LAYOUT = env("TENANTS_LAYOUT", default="tenant")
if LAYOUT not in ("tenant", "both"):
    raise ValueError(f"TENANTS_LAYOUT is 'tenant' or 'both', not {LAYOUT!r}")

_checkout = hashlib.sha256(str(Path(__file__).resolve().parent.parent).encode()).hexdigest()[:12]
_database = env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/postgres")
DATABASES = {
    "default": {
        **_database,
        "ENGINE": "django_tenants.postgresql_backend",
        "NAME": env(
            "PG_TENANTS_NAME", default=f"test_django_idempotency_{_checkout}_tenants_{LAYOUT}"
        ),
    }
}
DATABASE_ROUTERS = ["django_tenants.routers.TenantSyncRouter"]

SHARED_APPS = [
    "django_tenants",
    "tests.tenants.customers",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    *(["django_idempotency"] if LAYOUT == "both" else []),
]
TENANT_APPS = [
    "django.contrib.contenttypes",
    "django_idempotency",
    "tests.tenants.shop",
]
INSTALLED_APPS = [*SHARED_APPS, *[app for app in TENANT_APPS if app not in SHARED_APPS]]
TENANT_MODEL = "customers.Client"
TENANT_DOMAIN_MODEL = "customers.Domain"

MIDDLEWARE = ["django_tenants.middleware.main.TenantMainMiddleware"]
ROOT_URLCONF = "tests.tenants.shop.urls"
PUBLIC_SCHEMA_URLCONF = "tests.tenants.customers.public_urls"
TEMPLATES: list[dict[str, object]] = []
IDEMPOTENCY = {"PARTITION_RECORDS": env.bool("TENANTS_PARTITION_RECORDS", default=True)}
