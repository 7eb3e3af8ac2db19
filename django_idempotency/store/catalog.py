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

import logging
import threading
from typing import NamedTuple

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store.isolation import own_transaction
from django_idempotency.store.sql import TABLE

logger = logging.getLogger("django_idempotency")


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


#: A change of nothing to the partitioned record table (a column's unset ``n_distinct``
#: reset) that still sends the table's cache invalidation to every session. It takes
#: SHARE UPDATE EXCLUSIVE on the table alone, which no claim, completion or read waits
#: for, and waits at most 100 ms for a partition being attached or detached (the
#: setting ends with the statement's own transaction).
_RELOAD_PARTITION_MAP_SQL = f"""
DO $fn$
BEGIN
    PERFORM set_config('lock_timeout', '100ms', true);
    ALTER TABLE {TABLE} ALTER COLUMN sweep_after RESET (n_distinct);
END
$fn$
"""

#: Databases (alias) whose partition maps could not be reloaded: warned about once.
_reload_failed: set[str] = set()


def reload_partition_map(connection: BaseDatabaseWrapper) -> bool:
    """Make every session, this one included, read the record table's partitions again.

    A PostgreSQL session keeps a map of a partitioned table's partitions, built when
    first needed and rebuilt when the table changes. A session that builds it while
    another commits an ``ATTACH PARTITION`` can keep a map without the new partition
    until the table's next change (PostgreSQL 15: sessions that connect during the
    attach): its inserts into that day fail with "no partition ... found for row"
    however often they are retried, and its reads skip the day's rows. A change of
    nothing to the table makes every session rebuild its map. The claim calls this when
    its insert finds no partition for a day whose partition exists; the sweeper after
    it creates partitions.

    Args:
        connection: a PostgreSQL connection whose record table is partitioned. Only
            outside a transaction of the caller's (autocommit, no atomic block): there
            the change's lock would be held until that transaction ends, and every
            attach would wait for it.

    Returns:
        Whether the maps were invalidated. ``False`` inside a caller's transaction
        (nothing is sent), when the role does not own the table, or when a partition
        change held the table for more than 100 ms; the first failure per database is
        logged as a warning (docs/retention.md#partitions-and-sessions).
    """
    if not own_transaction(connection):
        return False
    try:
        with connection.cursor() as cursor:
            cursor.execute(_RELOAD_PARTITION_MAP_SQL)
    except DatabaseError as exc:
        if connection.alias not in _reload_failed:
            _reload_failed.add(connection.alias)
            logger.warning(
                "could not make sessions re-read the partitions of %s (%s): a session "
                "that missed an attached partition fails to claim keys of its day until "
                "the table changes again (docs/retention.md#partitions-and-sessions)",
                TABLE,
                exc,
            )
        return False
    return True
