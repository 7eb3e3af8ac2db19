"""Day partitions of the record table on PostgreSQL.

List them, create them ahead, drop them behind (the sweeper); the table itself, and
the conversions between the plain and the partitioned table, are ``store.schema``'s.
Every function takes a Django connection and runs in its current transaction state;
:func:`drop` needs autocommit (outside ``transaction.atomic``) to detach without
blocking claims. Days are UTC dates. See docs/retention.md.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.store import clock
from django_idempotency.store.schema.functions import PARTITION_PREFIX
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


#: The store's "now" on PostgreSQL: the database's clock plus the test offset (seconds).
_NOW = "(statement_timestamp() + %s * interval '1 second')"


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
    """The day partitions, attached or left detached by an interrupted drop, by day.

    Tables named like a partition but not attached to the record table are listed with
    ``attached=False``; other partitions (not named by this app) are left out.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, c.reltuples::bigint,
                   EXISTS (SELECT 1 FROM pg_inherits i
                           WHERE i.inhrelid = c.oid AND i.inhparent = p.oid
                             AND NOT i.inhdetachpending),
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


def ensure(connection: BaseDatabaseWrapper, day: dt.date) -> bool:
    """Create ``day``'s partition unless it exists. Returns whether it was created.

    Safe against concurrent callers (an advisory lock per day). Takes SHARE UPDATE
    EXCLUSIVE on the parent, which claims do not wait for.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT django_idempotency_ensure_partition(%s::date)", [day])
        (created,) = cursor.fetchone()
    return bool(created)


def drop(connection: BaseDatabaseWrapper, partition: Partition, *, lock_timeout: float) -> bool:
    """Detach ``partition`` from the record table and drop it, unless it came alive.

    In autocommit mode (the sweeper's normal case) it is detached ``CONCURRENTLY``,
    which never blocks claims; a detach left pending by an interrupted run is
    finalised. The detach waits for every transaction that was using the partition, so
    one that made a record in it live again meanwhile (a late completion, a heartbeat,
    a takeover, begun after the caller's probe) has committed by then: the detached
    table is probed again, and a partition that holds a live record is attached back
    and kept. Inside a transaction it is dropped directly, which needs a brief ACCESS
    EXCLUSIVE lock on the parent, waited for at most ``lock_timeout`` seconds (the
    caller's locked probe in the same transaction keeps writers out until then).

    Returns:
        Whether the partition was dropped (``False``: attached back, a record in it is
        live).

    Raises:
        django.db.OperationalError: the lock was not granted in time (retry later).
    """
    quoted = _qualified(connection, partition)
    parent = connection.ops.quote_name(TABLE)
    if connection.in_atomic_block:
        _drop_in_transaction(connection, quoted, lock_timeout)
        return True
    # Autocommit: no session setting (a transaction pooler would hand it to another
    # client); the detach is cancelled if it waits longer than lock_timeout, and the
    # drop runs in a transaction of its own with a transaction-local lock_timeout.
    with connection.cursor() as cursor:
        pending = _detach_pending(cursor, quoted)
        if partition.attached or pending:
            mode = "FINALIZE" if pending else "CONCURRENTLY"
            with _cancelled_after(connection, lock_timeout):
                cursor.execute(f"ALTER TABLE {parent} DETACH PARTITION {quoted} {mode}")
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {quoted} WHERE expires_at > {_NOW})",
            [clock.offset()],
        )
        if cursor.fetchone()[0]:
            _attach(cursor, parent, quoted, partition.day)
            return False
    with transaction.atomic(using=connection.alias):
        _drop_in_transaction(connection, quoted, lock_timeout)
    return True


def _attach(cursor: Any, parent: str, quoted: str, day: dt.date) -> None:
    """Attach a detached day partition back, with the bounds it was created with."""
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    cursor.execute(
        f"ALTER TABLE {parent} ATTACH PARTITION {quoted} FOR VALUES FROM (%s) TO (%s)",
        [start, start + dt.timedelta(days=1)],
    )


def _drop_in_transaction(connection: BaseDatabaseWrapper, quoted: str, lock_timeout: float) -> None:
    """``DROP TABLE`` waiting at most ``lock_timeout`` seconds, then the setting restored."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (previous,) = cursor.fetchone()
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{lock_timeout}s"])
        cursor.execute(f"DROP TABLE IF EXISTS {quoted}")
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


@contextmanager
def _cancelled_after(connection: BaseDatabaseWrapper, seconds: float) -> Iterator[None]:
    """Cancel the statement run in the block if it still runs after ``seconds``.

    A cancel request goes to the server (through a pooler, to the server session the
    statement runs on); the statement then fails with ``QueryCanceled`` (an
    ``OperationalError``). Used where a ``lock_timeout`` would have to be a session
    setting: ``DETACH PARTITION ... CONCURRENTLY`` cannot run in a transaction.
    """
    connection.ensure_connection()
    timer = threading.Timer(seconds, connection.connection.cancel)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


def holds_live_records(
    connection: BaseDatabaseWrapper,
    partition: Partition,
    now: dt.datetime,
    *,
    lock_timeout: float | None = None,
) -> bool:
    """Whether a record in ``partition`` is inside its window or holds a live lease.

    One probe of the partition's ``expires_at`` index: a record's window never ends
    before its lease (every write of the store keeps ``expires_at >= lease_until``, and
    no row is written otherwise).

    With ``lock_timeout`` (seconds), the probe first takes the partition's ``SHARE``
    lock, which waits for the transactions writing to it (a late completion, a
    heartbeat or a takeover of one of its records, not yet committed: the probe would
    not see what they write) and keeps new ones out until the probe's transaction ends
    (the caller's, inside one). Claims never write to a past day, and lookups are not
    blocked.

    Raises:
        django.db.OperationalError: ``lock_timeout`` passed before the lock was granted
            (a writer still runs: keep the day for now).
    """
    quoted = _qualified(connection, partition)
    if lock_timeout is None:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quoted} WHERE expires_at > %s)", [now])
            return bool(cursor.fetchone()[0])
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (previous,) = cursor.fetchone()
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{lock_timeout}s"])
        cursor.execute(f"LOCK TABLE {quoted} IN SHARE MODE")
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quoted} WHERE expires_at > %s)", [now])
        return bool(cursor.fetchone()[0])


def _detach_pending(cursor: Any, name: str) -> bool:
    """Whether the table ``name`` (quoted, with its schema) has a detach left pending."""
    cursor.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s) "
        "AND inhdetachpending)",
        [name],
    )
    return bool(cursor.fetchone()[0])
