"""What the initial migration does to the record table on PostgreSQL, and its days.

:func:`install` creates the fenced completion's function and, unless
``PARTITION_RECORDS`` is ``False`` (or the server is older than PostgreSQL 14),
converts the plain table the migration created into the day-partitioned one
(:func:`to_partitioned`); :func:`uninstall` reverses it. The conversions run in the
caller's transaction: all or nothing. The test suite uses them to run every store test
on both kinds of table.

The partitioned table has a default partition (``DEFAULT_PARTITION``) beside its day
partitions: a claim of a day that has no partition lands there, so no claim runs DDL.
:func:`create_day` creates a day (the migration, the sweeper) under the table's
ACCESS EXCLUSIVE lock (:func:`lock_table`), moving that day's rows out of the default
partition, so that no session ever inserts with a map of partitions that lacks it
(docs/retention.md).
"""

from __future__ import annotations

import datetime as dt
import math
import warnings
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.conf import conf
from django_idempotency.store import catalog, clock
from django_idempotency.store.schema.functions import (
    CLAIM_FUNCTION,
    COMPLETE_FUNCTION,
    COMPLETE_SIGNATURE,
    DEFAULT_PARTITION,
    DROP_PARTITION_FUNCTIONS,
    PARTITION_PREFIX,
    RECORD_FILLFACTOR,
    SCOPE_TRIGGER,
    SCOPE_TRIGGER_FUNCTION,
)
from django_idempotency.store.sql import TABLE

#: The oldest server the partitioned table runs on (13 brought BEFORE row triggers on
#: partitioned tables). Older servers keep the plain table.
MIN_SERVER_VERSION = 140000
_PLAIN_COPY = f"{TABLE}_unpartitioned"
_PARTITIONED_COPY = f"{TABLE}_partitioned"


def days_needed() -> int:
    """Days after today a claim made now may end its window in (PostgreSQL).

    The longest window (``MAX_RETENTION``, ``RETENTION``, the lease), in whole days.
    """
    window = max(conf.max_retention, conf.retention, conf.lease, 0.0)
    return math.ceil(window / 86400.0)


def days_ahead() -> int:
    """Days of partitions kept created after today (PostgreSQL).

    Enough for the window of a claim made now under ``MAX_RETENTION`` (and
    ``RETENTION``, and the lease), plus ``PARTITIONS_AHEAD`` days: a claim then lands in
    its own day's partition, not the default partition, even when the sweeper has not
    run for ``PARTITIONS_AHEAD`` days.
    """
    return days_needed() + max(conf.partitions_ahead, 0)


def install(
    connection: BaseDatabaseWrapper,
    *,
    complete: str = COMPLETE_FUNCTION,
    partitioned: Sequence[str] = (CLAIM_FUNCTION, SCOPE_TRIGGER_FUNCTION),
) -> None:
    """The initial migration's PostgreSQL part, forwards (no-op on other databases).

    Creates ``django_idempotency_complete`` and, per ``PARTITION_RECORDS`` (read when the
    migration runs; the store then detects the table's kind per connection), partitions
    the record table by day, with the partitions of today and of every day a claim made
    now may need (:func:`days_ahead`).

    Args:
        connection: the database's connection.
        complete: the ``CREATE FUNCTION`` statement of the completion (the migration's
            frozen text; by default this version's).
        partitioned: those of the partitioned table's functions (the claim, the scope
            trigger's), likewise.

    Warns:
        RuntimeWarning: the server is older than PostgreSQL 14; the table stays plain.
    """
    catalog.forget()
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:  # no parameters: the body has % signs
        cursor.execute(complete)
    if not conf.partition_records:
        _plain_fillfactor(connection)
        return
    if connection.pg_version < MIN_SERVER_VERSION:  # type: ignore[attr-defined]
        warnings.warn(
            "django-idempotency: PostgreSQL 14 or later is needed to partition the "
            "record table; it stays a plain table (swept by batched deletes).",
            RuntimeWarning,
            stacklevel=2,
        )
        _plain_fillfactor(connection)
        return
    today = clock.store_now(connection).date()
    days = [today + dt.timedelta(days=n) for n in range(days_ahead() + 1)]
    to_partitioned(connection, keep_since=None, days=days, functions=partitioned)


def uninstall(connection: BaseDatabaseWrapper) -> None:
    """The initial migration's PostgreSQL part, backwards: drop the functions it made.

    The tables themselves are dropped by the migration's ``DeleteModel`` operations.
    """
    catalog.forget()
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_scope_unique ON {TABLE}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {COMPLETE_SIGNATURE}")
    drop_functions(connection)


def install_functions(
    connection: BaseDatabaseWrapper,
    functions: Sequence[str] = (CLAIM_FUNCTION, SCOPE_TRIGGER_FUNCTION),
) -> None:
    """Create (or replace) the server-side functions of the partitioned table.

    ``functions``: their ``CREATE FUNCTION`` statements (by default this version's).
    """
    with connection.cursor() as cursor:
        for sql in functions:
            cursor.execute(sql)


def to_partitioned(
    connection: BaseDatabaseWrapper,
    *,
    keep_since: dt.datetime | None,
    days: list[dt.date],
    functions: Sequence[str] = (CLAIM_FUNCTION, SCOPE_TRIGGER_FUNCTION),
) -> int:
    """Replace the plain record table by a day-partitioned one (the initial migration).

    ``functions``: the ``CREATE FUNCTION`` statements of the partitioned table's
    functions (:func:`install_functions`).

    Locks the table, renames it, creates the partitioned table with the same columns
    and checks (partitioned by ``sweep_after``), its default partition and the
    partitions of ``days`` and of every day holding a copied row, copies the rows (with
    ``keep_since``, only those whose partition key is at or after it: older rows are
    those the sweeper would drop), drops the old table and builds the indexes. Runs in
    the caller's transaction: all or nothing. Returns the number of rows copied.
    """
    key = "sweep_after"
    since = f"WHERE {key} >= %s" if keep_since is not None else ""
    since_params = [keep_since] if keep_since is not None else []
    with connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {_PLAIN_COPY}")
        cursor.execute(
            f"CREATE TABLE {TABLE} (LIKE {_PLAIN_COPY} INCLUDING DEFAULTS INCLUDING "
            f"CONSTRAINTS INCLUDING IDENTITY) PARTITION BY RANGE ({key})"
        )
        install_functions(connection, functions)
        cursor.execute(
            f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {TABLE} DEFAULT "
            f"WITH (fillfactor = {RECORD_FILLFACTOR})"
        )
        cursor.execute(
            f"SELECT DISTINCT ({key} AT TIME ZONE 'UTC')::date FROM {_PLAIN_COPY} {since}",
            since_params,
        )
        row_days = {day for (day,) in cursor.fetchall()}
        for day in sorted(row_days | set(days)):
            _create_day(connection, cursor, day)
        cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM {_PLAIN_COPY} {since}", since_params)
        copied = int(cursor.rowcount)
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), "
            f"COALESCE((SELECT max(id) FROM {_PLAIN_COPY}), 0) + 1, false)"
        )
        cursor.execute(f"DROP TABLE {_PLAIN_COPY}")
        _rename_sequence(cursor, f"{TABLE}_id_seq")
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id, {key})")
        cursor.execute(
            f"CREATE INDEX django_idem_record_scope ON {TABLE} (principal, endpoint, key)"
        )
        cursor.execute(f"CREATE INDEX django_idem_record_expires ON {TABLE} (expires_at)")
        cursor.execute(f"CREATE INDEX django_idem_record_created ON {TABLE} (created_at)")
        cursor.execute(SCOPE_TRIGGER)
        cursor.execute(
            f"COMMENT ON TABLE {TABLE} IS 'django-idempotency records, one partition per UTC "
            f"day of {key}, and a default partition for days without one (the sweeper "
            "moves them into their day). Scope uniqueness: advisory lock + lookup in "
            "django_idempotency_claim() and the scope_unique trigger (docs/retention.md).'"
        )
    catalog.forget()
    return copied


def lock_table(cursor: Any, lock_timeout: float | None) -> None:
    """Take the record table's ACCESS EXCLUSIVE lock, held until the transaction ends.

    No claim, completion or read of the table runs while it is held: each waits for
    the lock (at most as long as the caller's transaction holds it). Creating or
    dropping a partition under it leaves no session with a stale map of partitions.

    Args:
        cursor: a cursor of a PostgreSQL connection inside a transaction (``LOCK TABLE``
            outside one fails).
        lock_timeout: seconds to wait for the lock before giving up, set for this
            statement only (``set_config(..., true)``; the caller's setting is restored
            once the lock is held); ``None``: the caller's setting.

    Raises:
        django.db.OperationalError: the lock was not granted within ``lock_timeout``
            (the transaction is aborted: roll it back, try later).
    """
    if lock_timeout is None:
        cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        return
    cursor.execute("SELECT current_setting('lock_timeout')")
    (previous,) = cursor.fetchone()
    milliseconds = max(int(lock_timeout * 1000), 1)
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{milliseconds}ms"])
    cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def create_day(
    connection: BaseDatabaseWrapper, day: dt.date, lock_timeout: float | None = None
) -> int | None:
    """Create ``day``'s partition unless it exists; move its rows out of the default.

    In one transaction (a savepoint inside the caller's) holding the record table's
    ACCESS EXCLUSIVE lock (:func:`lock_table`): creates the day's table with the newest
    partition's storage parameters (``RECORD_FILLFACTOR`` unless they name a
    ``fillfactor``), moves the default partition's rows of that day into it and
    attaches it; a table of that name left unattached is attached (with the default's
    rows of the day). Claims of the table wait while it runs: the time to move the
    day's rows and to check the default partition holds none of that day.

    Args:
        connection: a PostgreSQL connection whose record table is partitioned.
        day: the UTC day of ``sweep_after`` the partition holds.
        lock_timeout: seconds to wait for the table's lock (``None``: the connection's
            ``lock_timeout``, by default no limit).

    Returns:
        The number of rows moved from the default partition, or ``None`` when the day's
        partition was attached already (nothing changed).

    Raises:
        django.db.OperationalError: the lock was not granted within ``lock_timeout``.
    """
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        lock_table(cursor, lock_timeout)
        return _create_day(connection, cursor, day)


#: What :func:`_create_day` reads: the record table's schema, whether the day is
#: attached, whether a table of its name exists, the default partition, and the
#: newest day partition's storage parameters.
_DAY_FACTS_SQL = f"""
SELECT n.nspname,
       EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = p.oid AND c.relname = %(name)s),
       EXISTS (SELECT 1 FROM pg_class c
               WHERE c.relnamespace = p.relnamespace AND c.relname = %(name)s),
       (SELECT c.relname FROM pg_class c WHERE c.oid = pt.partdefid),
       (SELECT c.reloptions FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = p.oid AND c.relname LIKE %(prefix)s
        ORDER BY c.relname DESC LIMIT 1)
FROM pg_class p JOIN pg_namespace n ON n.oid = p.relnamespace
LEFT JOIN pg_partitioned_table pt ON pt.partrelid = p.oid
WHERE p.oid = to_regclass('{TABLE}')
"""


def _create_day(connection: BaseDatabaseWrapper, cursor: Any, day: dt.date) -> int | None:
    """:func:`create_day`'s work, the table's ACCESS EXCLUSIVE lock already held."""
    quote = connection.ops.quote_name
    name = f"{PARTITION_PREFIX}{day:%Y%m%d}"
    cursor.execute(
        _DAY_FACTS_SQL, {"name": name, "prefix": PARTITION_PREFIX.replace("_", r"\_") + "%"}
    )
    schema, attached, present, default, options = cursor.fetchone()
    if attached:
        return None
    parent = f"{quote(schema)}.{quote(TABLE)}"
    table = f"{quote(schema)}.{quote(name)}"
    if not present:
        options = list(options or [])
        if not any(option.startswith("fillfactor=") for option in options):
            options.append(f"fillfactor={RECORD_FILLFACTOR}")
        cursor.execute(
            f"CREATE TABLE {table} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
            f"WITH ({', '.join(options)})"
        )
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    bounds = [start, start + dt.timedelta(days=1)]
    moved = 0
    if default is not None:
        cursor.execute(
            f"WITH moved AS (DELETE FROM {quote(schema)}.{quote(default)} "
            "WHERE sweep_after >= %s AND sweep_after < %s RETURNING *) "
            f"INSERT INTO {table} SELECT * FROM moved",
            bounds,
        )
        moved = int(cursor.rowcount)
    cursor.execute(
        f"ALTER TABLE {parent} ATTACH PARTITION {table} FOR VALUES FROM (%s) TO (%s)", bounds
    )
    return moved


def to_plain(connection: BaseDatabaseWrapper, schema_editor: Any, model: Any) -> int:
    """Replace the partitioned record table by a plain one (the tests switch between both kinds).

    ``model`` is the historical ``IdempotencyRecord``; ``schema_editor`` creates its
    table with the unique constraint. Rows are copied newest first; should one scope
    have two rows (one left past the retention window), the newer is kept. Returns the
    number of rows copied.
    """
    columns = ", ".join(connection.ops.quote_name(f.column) for f in model._meta.concrete_fields)
    with connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {_PARTITIONED_COPY}")
        cursor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_scope_unique ON {_PARTITIONED_COPY}")
        cursor.execute(
            f"ALTER TABLE {_PARTITIONED_COPY} RENAME CONSTRAINT {TABLE}_pkey "
            f"TO {_PARTITIONED_COPY}_pkey"
        )
        for index in (
            "django_idem_record_scope",
            "django_idem_record_expires",
            "django_idem_record_created",
        ):
            cursor.execute(f"DROP INDEX IF EXISTS {index}")
        # Free the names PostgreSQL gives unnamed column checks (response_status >= 0).
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) "
            "AND contype = 'c' AND conname LIKE %s",
            [_PARTITIONED_COPY, TABLE.replace("_", r"\_") + r"\_%\_check"],
        )
        for (name,) in cursor.fetchall():
            renamed = f"{_PARTITIONED_COPY}{name.removeprefix(TABLE)}"
            cursor.execute(
                f'ALTER TABLE {_PARTITIONED_COPY} RENAME CONSTRAINT "{name}" TO "{renamed}"'
            )
        _rename_sequence(cursor, f"{_PARTITIONED_COPY}_id_seq", table=_PARTITIONED_COPY)
        schema_editor.create_model(model)
        _plain_fillfactor(connection)
        cursor.execute(
            f"INSERT INTO {TABLE} ({columns}) SELECT {columns} FROM {_PARTITIONED_COPY} "
            "ORDER BY created_at DESC ON CONFLICT DO NOTHING"
        )
        copied = int(cursor.rowcount)
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), "
            f"COALESCE((SELECT max(id) FROM {_PARTITIONED_COPY}), 0) + 1, false)"
        )
        cursor.execute(f"DROP TABLE {_PARTITIONED_COPY}")
        drop_functions(connection)
    catalog.forget()
    return copied


def drop_functions(connection: BaseDatabaseWrapper) -> None:
    """Drop the server-side functions of the partitioned table, if present."""
    with connection.cursor() as cursor:
        for sql in DROP_PARTITION_FUNCTIONS:
            cursor.execute(sql)


def _plain_fillfactor(connection: BaseDatabaseWrapper) -> None:
    """Give the plain record table the partitions' ``fillfactor`` (``RECORD_FILLFACTOR``)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} SET (fillfactor = {RECORD_FILLFACTOR})")


def _rename_sequence(cursor: Any, name: str, *, table: str = TABLE) -> None:
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    (current,) = cursor.fetchone()
    if current and current.rsplit(".", 1)[-1].strip('"') != name:
        cursor.execute(f"ALTER SEQUENCE {current} RENAME TO {name}")
