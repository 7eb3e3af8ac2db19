"""Schema-per-tenant databases (django-tenants): which schemas hold records (docs/tenants.md).

django-tenants gives each tenant a PostgreSQL schema and its connection a current
schema (``connection.schema_name``): every statement runs under ``search_path`` =
that schema, then ``public``. The record and outbox tables, and the functions the
migration installs, are created in each tenant's schema by ``migrate_schemas`` when
the app is in ``TENANT_APPS``; none of them names a schema, so a statement finds the
current tenant's.

The sweeper and the relay run outside any request, so nothing has chosen a schema for
them: they cover :func:`schemas`, every schema of the database that holds the record
table, one after the other, each under :func:`use_schema`. Nothing here imports
django-tenants: a connection is a tenant connection when it has its ``set_schema``
and ``set_tenant`` methods and its ``schema_name``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store.catalog import TABLE


def is_tenant_connection(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` switches schemas per tenant (django-tenants' backend)."""
    return (
        connection.vendor == "postgresql"
        and hasattr(connection, "schema_name")
        and callable(getattr(connection, "set_schema", None))
        and callable(getattr(connection, "set_tenant", None))
    )


def current_schema(connection: BaseDatabaseWrapper) -> str | None:
    """The schema a tenant connection runs in now; ``None`` on any other connection.

    Read from the connection object (no query): django-tenants sets it per request
    before the first statement, and issues the ``search_path`` with that statement.
    """
    if not is_tenant_connection(connection):
        return None
    schema = getattr(connection, "schema_name", None)
    return str(schema) if schema is not None else None


def schemas(using: str) -> tuple[str, ...] | None:
    """The schemas of database ``using`` that hold the record table, by name.

    Asked of the catalog, so it lists every tenant's schema that ``migrate_schemas``
    created the tables in, and ``public`` when the app is in ``SHARED_APPS`` too.

    Args:
        using: a database alias.

    Returns:
        The schema names; ``None`` when ``using`` is not a tenant connection (the
        caller then works in the connection's own schema, as on any database).
    """
    connection = connections[using]
    if not is_tenant_connection(connection):
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = %s AND c.relkind IN ('r', 'p') ORDER BY n.nspname",
            [TABLE],
        )
        return tuple(str(name) for (name,) in cursor.fetchall())


def targets(aliases: Iterable[str]) -> list[tuple[str, str | None]]:
    """``(alias, schema)`` pairs a sweep or a relay run covers, in order.

    Each alias once with ``None`` (its own schema), except tenant connections: one
    pair per schema that holds the record table (:func:`schemas`).
    """
    found: list[tuple[str, str | None]] = []
    for alias in aliases:
        names = schemas(alias)
        if names is None:
            found.append((alias, None))
        else:
            found.extend((alias, name) for name in names)
    return found


def label(alias: str, schema: str | None) -> str:
    """How logs and reports name a database and schema: ``'default'``, ``'default/acme'``."""
    return alias if schema is None else f"{alias}/{schema}"


@contextmanager
def use_schema(using: str, schema: str | None) -> Iterator[None]:
    """Run the block with the calling thread's connection to ``using`` in ``schema``.

    The connection's previous tenant is set back when the block ends. ``None``, or a
    connection that is not a tenant connection, changes nothing.
    """
    connection = connections[using]
    if schema is None or not is_tenant_connection(connection):
        yield
        return
    previous = getattr(connection, "tenant", None)
    connection.set_schema(schema)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if previous is not None:
            connection.set_tenant(previous)  # type: ignore[attr-defined]


def enter_schema(using: str, schema: str | None) -> None:
    """Put the calling thread's connection to ``using`` in ``schema``, for good.

    For a thread of its own (the relay's handlers, its marks' writer): its
    connections are its own and closed when it ends. ``None`` changes nothing.
    """
    connection = connections[using]
    if schema is not None and is_tenant_connection(connection):
        connection.set_schema(schema)  # type: ignore[attr-defined]
