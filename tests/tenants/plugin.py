"""The schema-per-tenant suite's database: created for the run, three tenants, dropped after.

The public schema is a tenant too (django-tenants' public tenant, host ``public.test``):
it holds the app's tables only in the ``both`` layout (``TENANTS_LAYOUT``).

Loaded with ``-p tests.tenants.plugin`` by tests/integration/test_tenants.py, which runs
tests/tenants/scenarios.py in a pytest of its own (``DJANGO_SETTINGS_MODULE`` =
``tests.tenants.settings``): django-tenants needs its own database backend, router and
apps, which the main suite's settings cannot share. The database is real and
committed to (threads with their own connections see each other's writes), so the
tests keep apart by their idempotency keys, not by rolled-back transactions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings

#: Tenants whose record table is day-partitioned (``PARTITION_RECORDS``, the default).
PARTITIONED = ("alpha", "beta")
#: A tenant migrated with ``PARTITION_RECORDS = False``: its record table stays plain.
PLAIN = ("gamma",)
TENANTS = (*PARTITIONED, *PLAIN)
#: The app in SHARED_APPS as well as TENANT_APPS: public has records of its own.
BOTH = os.environ.get("TENANTS_LAYOUT", "tenant") == "both"  # as tests/tenants/settings.py
#: The schemas holding the app's tables, as a sweep or a relay run lists them.
SCHEMAS = tuple(sorted((*TENANTS, "public"))) if BOTH else TENANTS


def _maintenance() -> Any:
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db.get("HOST") or "127.0.0.1",
        port=int(db.get("PORT") or 5432),
        user=db.get("USER") or "postgres",
        password=db.get("PASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    )


def _drop_database(name: str) -> None:
    with _maintenance() as maintenance:
        maintenance.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def tenant_database(django_db_blocker: Any) -> Iterator[tuple[str, ...]]:
    """A fresh database: the shared apps in ``public``, then one schema per tenant."""
    name = settings.DATABASES["default"]["NAME"]
    _drop_database(name)
    with _maintenance() as maintenance:
        maintenance.execute(f'CREATE DATABASE "{name}"')
    with django_db_blocker.unblock():
        call_command("migrate_schemas", "--shared", verbosity=0)
        from tests.tenants.customers.models import Client, Domain

        public = Client.objects.create(schema_name="public", name="Public")  # no migration
        Domain.objects.create(domain="public.test", tenant=public, is_primary=True)
        for schema in TENANTS:  # creating a tenant migrates its schema (TENANT_APPS)
            partitioned = {"PARTITION_RECORDS": schema in PARTITIONED}
            with override_settings(IDEMPOTENCY=partitioned):
                tenant = Client.objects.create(schema_name=schema, name=schema.title())
            Domain.objects.create(domain=f"{schema}.test", tenant=tenant, is_primary=True)
        connections.close_all()
    yield TENANTS
    connections.close_all()
    _drop_database(name)


@pytest.fixture(autouse=True)
def tenant_db(tenant_database: tuple[str, ...], django_db_blocker: Any) -> Iterator[None]:
    """Database access for each test, its connection back in ``public`` afterwards."""
    with django_db_blocker.unblock():
        yield
        connection.set_schema_to_public()  # type: ignore[attr-defined]
        connections.close_all()
