"""What the hot path needs to know of a PostgreSQL database, asked once per process.

One catalog query per database (alias and name) and schema tells whether the record
table is partitioned and which port the server listens on; the answer is cached, so a
claim pays nothing for it even with ``CONN_MAX_AGE = 0``. The schema is the one a
schema-per-tenant connection (django-tenants) runs in now, ``connection.schema_name``:
each tenant's schema has its own record table, which may be of another kind than the
next tenant's (docs/tenants.md). The lookup names no schema on purpose: it finds the
record table the store's own statements find through the connection's ``search_path``
(the tenant's, or ``public``'s when the app is in ``SHARED_APPS`` only), which is the
one whose kind matters. Migrations that change the table,
and any failing claim statement, call :func:`forget`, so a process that outlives a
migration reads it again.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store.sql import TABLE


class _Facts(NamedTuple):
    partitioned: bool
    port: int | None


_kinds: dict[tuple[str, str, str | None], _Facts] = {}


_kinds_lock = threading.Lock()


def _facts(connection: BaseDatabaseWrapper) -> _Facts:
    """What the hot path needs to know of a database and schema, asked once per process."""
    schema = getattr(connection, "schema_name", None)  # django-tenants' current schema
    cache_key = (
        connection.alias,
        str(connection.settings_dict.get("NAME")),
        None if schema is None else str(schema),
    )
    facts = _kinds.get(cache_key)
    if facts is None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)), "
                "current_setting('port')",
                [TABLE],
            )
            kind, port = cursor.fetchone()
        facts = _Facts(kind == "p", int(port) if port else None)
        with _kinds_lock:
            _kinds[cache_key] = facts
    return facts


def is_partitioned(connection: BaseDatabaseWrapper) -> bool:
    """Whether the record table on ``connection`` is a partitioned PostgreSQL table.

    Asked once per process, database and tenant schema (one catalog query, which also reads the
    server's port for :func:`server_port`), then cached, so the claim's hot path pays
    nothing even with ``CONN_MAX_AGE = 0``. Migrations that change the table, and any
    failing claim statement, call :func:`forget`, so a process that outlives a
    migration re-reads it. ``False`` on other backends, and when the table does not
    exist.
    """
    if connection.vendor != "postgresql":
        return False
    return _facts(connection).partitioned


def server_port(connection: BaseDatabaseWrapper) -> int | None:
    """The port the PostgreSQL server behind ``connection`` listens on (its setting).

    Read with :func:`is_partitioned`'s query, cached the same way. A client port that
    differs from it means something stands between (a pooler such as PgBouncer, or a
    proxy): owner presence's detection uses it (``store.presence``).
    """
    if connection.vendor != "postgresql":
        return None
    return _facts(connection).port


def forget() -> None:
    """Drop the cached table kinds (after a migration changed the table)."""
    with _kinds_lock:
        _kinds.clear()


def has_advisory_locks(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection``'s database has advisory locks (PostgreSQL's).

    The sweeper takes one so that a second concurrent run does nothing; elsewhere runs
    are not serialised (every step is idempotent).
    """
    return connection.vendor == "postgresql"
