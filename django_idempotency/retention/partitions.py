"""Day partitions of the record table on PostgreSQL.

List them, create them ahead, drop them behind, and empty the default partition of
what is past its window (the sweeper); the table itself, the creation of a day and the
conversions between the plain and the partitioned table are ``store.schema``'s.
Creating or dropping a day holds the record table's ACCESS EXCLUSIVE lock for a
moment: claims wait for it, at most ``lock_timeout`` (the sweeper gives up past it and
tries again next run). Every function takes a Django connection and runs in its
current transaction state. Days are UTC dates. See docs/retention.md.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store import clock
from django_idempotency.store.schema import tables
from django_idempotency.store.schema.functions import DEFAULT_PARTITION, PARTITION_PREFIX
from django_idempotency.store.sql import TABLE


@dataclass(frozen=True)
class Partition:
    """One day partition: its table name, UTC day and estimated row count (-1: unknown).

    ``schema``: the schema it is in, the record table's (``""``: unnamed, found through
    ``search_path``). Every statement on a listed partition names that schema, so a
    tenant's sweep never reaches a partition of the same day in ``public``.
    """

    name: str
    day: dt.date
    rows: int
    attached: bool = True
    schema: str = ""


def _qualified(connection: BaseDatabaseWrapper, partition: Partition) -> str:
    """``partition``'s table name for SQL, with its schema when known."""
    quote = connection.ops.quote_name
    name = quote(partition.name)
    return f"{quote(partition.schema)}.{name}" if partition.schema else name


def partition_name(day: dt.date) -> str:
    """The table name of ``day``'s partition."""
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def _day_of(name: str) -> dt.date | None:
    suffix = name.removeprefix(PARTITION_PREFIX)
    if suffix == name or len(suffix) != 8 or not suffix.isdigit():
        return None
    try:
        return dt.datetime.strptime(suffix, "%Y%m%d").date()
    except ValueError:
        return None


def list_partitions(connection: BaseDatabaseWrapper) -> list[Partition]:
    """The day partitions, by day (the default partition is not one).

    Tables named like a partition but not attached to the record table are listed with
    ``attached=False``; other partitions (not named by this app) are left out.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, c.reltuples::bigint,
                   EXISTS (SELECT 1 FROM pg_inherits i
                           WHERE i.inhrelid = c.oid AND i.inhparent = p.oid),
                   n.nspname
            FROM pg_class p JOIN pg_class c ON c.relnamespace = p.relnamespace
            JOIN pg_namespace n ON n.oid = p.relnamespace
            WHERE p.oid = to_regclass(%s) AND c.relkind = 'r'
              AND c.relname LIKE %s
            """,
            [TABLE, PARTITION_PREFIX.replace("_", r"\_") + "%"],
        )
        rows = cursor.fetchall()
    found = []
    for name, tuples, attached, schema in rows:
        day = _day_of(name)
        if day is not None:
            found.append(Partition(name, day, int(tuples), bool(attached), str(schema)))
    return sorted(found, key=lambda p: p.day)


def ensure(
    connection: BaseDatabaseWrapper, day: dt.date, *, lock_timeout: float | None = None
) -> int | None:
    """Create ``day``'s partition unless it exists (``store.schema.tables.create_day``).

    Moves the default partition's records of that day into it.

    Args:
        connection: a PostgreSQL connection whose record table is partitioned.
        day: the UTC day.
        lock_timeout: seconds to wait for the record table's lock (``None``: no limit
            beyond the connection's own).

    Returns:
        The number of records moved out of the default partition, or ``None`` when the
        partition existed already.

    Raises:
        django.db.OperationalError: the lock was not granted within ``lock_timeout``.
    """
    return tables.create_day(connection, day, lock_timeout)


def drop(connection: BaseDatabaseWrapper, partition: Partition, *, lock_timeout: float) -> bool:
    """Drop ``partition`` unless a record in it is live (in its window or its lease).

    In one transaction (a savepoint inside the caller's) holding the record table's
    ACCESS EXCLUSIVE lock, waited for at most ``lock_timeout`` seconds: the partition
    is probed (:func:`holds_live_records`), then dropped. With the lock held no writer
    can make one of its records live between the probe and the drop, and no session
    keeps a map of partitions that names it.

    Returns:
        Whether the partition was dropped (``False``: a record in it is live).

    Raises:
        django.db.OperationalError: the lock was not granted in time (retry later).
    """
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        tables.lock_table(cursor, lock_timeout)
        if holds_live_records(connection, partition, clock.store_now(connection)):
            return False
        cursor.execute(f"DROP TABLE IF EXISTS {_qualified(connection, partition)}")
    return True


def holds_live_records(
    connection: BaseDatabaseWrapper, partition: Partition, now: dt.datetime
) -> bool:
    """Whether a record in ``partition`` is inside its window or holds a live lease.

    One probe of the partition's ``expires_at`` index: a record's window never ends
    before its lease (every write of the store keeps ``expires_at >= lease_until``, and
    no row is written otherwise). It sees what is committed: :func:`drop` calls it under
    the record table's lock, which waits for every writer of the table to end first.
    """
    quoted = _qualified(connection, partition)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quoted} WHERE expires_at > %s)", [now])
        return bool(cursor.fetchone()[0])


def purge_default(
    connection: BaseDatabaseWrapper, now: dt.datetime, *, batch: int, dry_run: bool = False
) -> int:
    """Delete the default partition's records past their window and lease.

    Records land there when their day has no partition (the sweeper did not run for
    days); once their day is past, no day partition is created for them, and they are
    deleted here, ``batch`` rows per statement, each its own transaction outside the
    caller's (a record made live meanwhile by a late completion or a heartbeat is kept:
    the DELETE tests its conditions again on the row that writer left).

    Args:
        connection: a PostgreSQL connection whose record table is partitioned.
        now: the store's clock.
        batch: rows per statement (at least 1).
        dry_run: delete nothing; count what would be deleted.

    Returns:
        The number of records deleted (or that would be).
    """
    table = f"{connection.ops.quote_name(DEFAULT_PARTITION)}"
    if current := _record_schema(connection):
        table = f"{connection.ops.quote_name(current)}.{table}"
    condition = "expires_at <= %s AND (state = 'completed' OR lease_until <= %s)"
    with connection.cursor() as cursor:
        if dry_run:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE {condition}", [now, now])
            return int(cursor.fetchone()[0])
        total = 0
        while True:
            with transaction.atomic(using=connection.alias):
                cursor.execute(
                    f"DELETE FROM {table} WHERE ctid = ANY (ARRAY (SELECT ctid FROM {table} "
                    f"WHERE {condition} LIMIT %s)) AND {condition}",
                    [now, now, max(batch, 1), now, now],
                )
                deleted = int(cursor.rowcount)
            total += deleted
            if deleted < max(batch, 1):
                return total


def _record_schema(connection: BaseDatabaseWrapper) -> str:
    """The schema of the record table the connection's statements find."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(%s)",
            [TABLE],
        )
        row = cursor.fetchone()
    return str(row[0]) if row else ""
