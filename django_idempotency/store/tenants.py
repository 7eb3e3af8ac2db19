"""Schema-per-tenant databases (django-tenants): which schemas hold records (docs/tenants.md).

django-tenants gives each tenant a PostgreSQL schema and its connection a current
schema (``connection.schema_name``): every statement runs under ``search_path`` =
that schema, then ``public``. The record and outbox tables, and the functions the
migration installs, are created in each tenant's schema by ``migrate_schemas`` when
the app is in ``TENANT_APPS``; none of them names a schema, so a statement finds the
current tenant's.

A request's other connections (the heartbeat's, the lease extension's second one)
start in ``public`` like every new django-tenants connection: they take the request's
schema with :func:`place_of` and :func:`enter` (or :func:`copy_of`).

The sweeper and the relay run outside any request, so nothing has chosen a schema for
them: they cover :func:`schemas`, every tenant schema of the database that holds the
record table, one after the other, each under :func:`use_schema`. Nothing here imports
django-tenants: a connection is a tenant connection when it has its ``set_schema``
and ``set_tenant`` methods and its ``schema_name``; the tenants are the rows of
django-tenants' ``TENANT_MODEL``, and ``public`` is its ``PUBLIC_SCHEMA_NAME``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store.sql import TABLE

logger = logging.getLogger("django_idempotency")


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


def public_schema() -> str:
    """The name of django-tenants' shared schema (its ``PUBLIC_SCHEMA_NAME`` setting)."""
    return str(getattr(settings, "PUBLIC_SCHEMA_NAME", "public"))


def _tenant_schemas(connection: BaseDatabaseWrapper) -> list[str]:
    """The schema names of the rows of django-tenants' ``TENANT_MODEL``, read in public.

    The tenant table is named with its schema, so a table of that name in the
    connection's current schema is never read instead.
    """
    label = getattr(settings, "TENANT_MODEL", None)
    if not label:
        return []
    model = apps.get_model(str(label))
    quote = connection.ops.quote_name
    table = f"{quote(public_schema())}.{quote(model._meta.db_table)}"
    column = quote(model._meta.get_field("schema_name").column)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table}")
        return [str(name) for (name,) in cursor.fetchall()]


def schemas(using: str) -> tuple[str, ...] | None:
    """The tenant schemas of database ``using`` that hold the record table, by name.

    A tenant schema is one django-tenants knows: a row of its ``TENANT_MODEL``, or its
    public schema. Asked of the catalog for the record table in each of them, so it
    lists every tenant's schema that ``migrate_schemas`` created the tables in, and
    ``public`` when the app is in ``SHARED_APPS`` too; another schema that holds a table
    of that name (a template, a backup, a schema being cloned) is not listed.

    Args:
        using: a database alias.

    Returns:
        The schema names; ``None`` when ``using`` is not a tenant connection (the
        caller then works in the connection's own schema, as on any database).
    """
    connection = connections[using]
    if not is_tenant_connection(connection):
        return None
    known = {public_schema(), *_tenant_schemas(connection)}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = %s AND c.relkind IN ('r', 'p') AND n.nspname = ANY(%s) "
            "ORDER BY n.nspname",
            [TABLE, sorted(known)],
        )
        return tuple(str(name) for (name,) in cursor.fetchall())


def gone(using: str, schema: str | None) -> bool:
    """Whether tenant schema ``schema`` of ``using`` no longer holds records (dropped).

    Asked after a statement in that schema failed: a tenant deleted while a sweep or
    a relay pass ran over it takes its schema and tables along, and is skipped rather
    than failing the run for every other tenant. ``False`` for ``None`` (the
    connection's own schema) and on other databases.

    Raises:
        django.db.DatabaseError: the database could not be asked.
    """
    if schema is None:
        return False
    found = schemas(using)
    return found is not None and schema not in found


def dropped_during(using: str, schema: str | None, exc: BaseException, what: str) -> bool:
    """Whether ``exc``, raised by ``what`` in tenant schema ``schema``, came from its drop.

    A tenant deleted while a sweep or a relay pass runs over its schema takes its tables
    along: the pass skips that schema (logged at INFO on the ``django_idempotency``
    logger) and goes on with the other tenants. An outage (``OperationalError``,
    ``InterfaceError``), a failure in the connection's own schema (``None``), or a
    schema that still holds its tables is not a drop: the caller raises ``exc``.

    Args:
        using: the database alias.
        schema: the tenant schema the work ran in.
        exc: what the work raised.
        what: the work, for the log line (``"idempotency sweep"``, ``"outbox relay"``).
    """
    if schema is None or not isinstance(exc, DatabaseError):
        return False
    if isinstance(exc, (OperationalError, InterfaceError)):
        return False
    try:
        dropped = gone(using, schema)
    except DatabaseError:  # a transaction the failure aborted, or the database itself
        return False
    if dropped:
        logger.info(
            "%s: tenant schema %r of database %r was dropped while it ran; skipped",
            what,
            schema,
            using,
        )
    return dropped


#: SQLSTATEs of a statement naming a table or a function that does not exist.
_UNDEFINED = frozenset({"42P01", "42883"})


def schema_without_tables(using: str, exc: BaseException) -> str | None:
    """The schema a failed claim ran in, when it failed because that schema has no store.

    On a schema-per-tenant database a request runs in its tenant's schema (``public``
    for the public site). A schema without the record table (``public`` while the app
    is in ``TENANT_APPS`` only, or a tenant whose migrations never ran) fails every
    claim: a deployment mistake, not an outage (docs/tenants.md). Asked only after a
    statement failed for a missing table or function; the lookup names no schema on
    purpose: it finds the table the claim's own statements would use.

    Returns:
        The schema name; ``None`` for any other failure, on any other database, or
        when the connection cannot be asked (a transaction the failure aborted).
    """
    connection = connections[using]
    sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
    if sqlstate not in _UNDEFINED or not is_tenant_connection(connection):
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s) IS NULL", [TABLE])
            (missing,) = cursor.fetchone()
    except DatabaseError:
        return None
    return current_schema(connection) if missing else None


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


@dataclass(frozen=True)
class Place:
    """Where a tenant connection runs: django-tenants' tenant and its ``search_path`` choice."""

    tenant: Any
    include_public: bool

    @property
    def schema(self) -> str:
        """The tenant's schema name."""
        return str(self.tenant.schema_name)


def place_of(connection: BaseDatabaseWrapper) -> Place | None:
    """Where ``connection`` runs now; ``None`` when it is not a tenant connection."""
    if not is_tenant_connection(connection):
        return None
    tenant = getattr(connection, "tenant", None)
    if tenant is None:
        return None
    return Place(tenant, bool(getattr(connection, "include_public_schema", True)))


def put(connection: BaseDatabaseWrapper, place: Place | None) -> None:
    """Make ``connection`` run where ``place`` says (``None``: leave it as it is).

    The ``search_path`` goes with the connection's next statement.
    """
    if place is not None and is_tenant_connection(connection):
        connection.set_tenant(place.tenant, include_public=place.include_public)  # type: ignore[attr-defined]


def enter(using: str, place: Place | None) -> None:
    """Put the calling thread's connection to ``using`` where ``place`` says, for good.

    For a thread that works for a request (the heartbeat): a new django-tenants
    connection starts in ``public``, whatever schema the request runs in.
    """
    put(connections[using], place)


def copy_of(connection: BaseDatabaseWrapper) -> BaseDatabaseWrapper:
    """A second connection like ``connection``, in the schema ``connection`` runs in.

    ``connection.copy()`` alone starts a django-tenants connection in ``public``. The
    caller closes the copy.
    """
    copy = connection.copy()
    put(copy, place_of(connection))
    return copy


@contextmanager
def placed(using: str, place: Place | None) -> Iterator[None]:
    """Run the block with this thread's connection to ``using`` where ``place`` says.

    The connection is put back where it was when the block ends. ``None``, or a
    connection that is not a tenant connection, changes nothing.
    """
    connection = connections[using]
    if place is None or not is_tenant_connection(connection):
        yield
        return
    previous = place_of(connection)
    put(connection, place)
    try:
        yield
    finally:
        put(connection, previous)


def places() -> dict[str, Place]:
    """Where this thread's tenant connections run, by alias (for threads working for it).

    A thread's own django-tenants connections start in ``public``: a thread that works
    for this one enters these places first (:func:`enter`).
    """
    found = {}
    for alias in connections:
        place = place_of(connections[alias])
        if place is not None:
            found[alias] = place
    return found


@contextmanager
def use_schema(using: str, schema: str | None) -> Iterator[None]:
    """Run the block with the calling thread's connection to ``using`` in ``schema``.

    The connection is put back where it was (its tenant and ``search_path``) when the
    block ends, however it ends: the next task or request of a worker runs in the
    schema it chose, never in the last one swept or relayed. ``None``, or a connection
    that is not a tenant connection, changes nothing.
    """
    connection = connections[using]
    if schema is None or not is_tenant_connection(connection):
        yield
        return
    previous = place_of(connection)
    connection.set_schema(schema)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        put(connection, previous)


def enter_schema(using: str, schema: str | None) -> None:
    """Put the calling thread's connection to ``using`` in ``schema``, for good.

    For a thread of its own (the relay's handlers, its lease keeper): its
    connections are its own and closed when it ends. ``None`` changes nothing.
    """
    connection = connections[using]
    if schema is not None and is_tenant_connection(connection):
        connection.set_schema(schema)  # type: ignore[attr-defined]
