"""Read-only statements behind the operators' reports and the metrics' gauges.

* :func:`outbox_stats`: the outbox's counts and lag by the store's clock, the
  :class:`OutboxStats` that ``metrics.outbox_stats`` returns (docs/observability.md);
* :func:`partition_stats`: how many days ahead have a partition of their own, and
  whether records wait in the default partition (PostgreSQL's partitioned record
  table: docs/retention.md#days-ahead-and-the-default-partition);
* :func:`bounded_rows`: the rows of a read-only statement that may run at most a given
  time (PostgreSQL's ``statement_timeout``), for the keys-minted audit
  (docs/operations.md#keys-minted-per-attempt).

Callers get the same answer on every database; what differs between them stays here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Count, Min, Q

from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.catalog import is_partitioned
from django_idempotency.store.rows import sqlstate_of
from django_idempotency.store.schema.functions import DEFAULT_PARTITION, PARTITION_PREFIX
from django_idempotency.store.sql import TABLE

#: SQLSTATE of a statement cancelled by ``statement_timeout`` (PostgreSQL).
QUERY_CANCELED = "57014"


@dataclass(frozen=True)
class OutboxStats:
    """The outbox's state now, for gauges such as the outbox lag (docs/observability.md).

    Attributes:
        pending: messages not yet delivered (due, backing off, or held by a relay).
        due: pending messages due now, that no relay holds: the relay's backlog.
        dead: dead-lettered messages (need an operator: docs/operations.md).
        lag: seconds the oldest due message has been waiting since it became due;
            0.0 when nothing is due. Grows when no relay runs or relays fall behind.
        oldest_pending_age: seconds since the oldest pending message was enqueued,
            backoff included; 0.0 when nothing is pending.
    """

    pending: int
    due: int
    dead: int
    lag: float
    oldest_pending_age: float


_PG_STATS_SQL = """
SELECT count(*),
       count(*) FILTER (WHERE available_at <= {now}),
       (SELECT count(*) FROM {table} WHERE state = 'dead'),
       COALESCE(EXTRACT(EPOCH FROM {now} - min(available_at)
                FILTER (WHERE available_at <= {now})), 0)::float8,
       COALESCE(EXTRACT(EPOCH FROM {now} - min(created_at)), 0)::float8
FROM {table} WHERE state = 'pending'
"""


def outbox_stats(using: str) -> OutboxStats:
    """Count the outbox's messages on ``using`` and measure its lag with the store's clock.

    One statement on PostgreSQL: aggregates over the pending rows, and a count of the
    dead ones (no index covers ``state = 'dead'``, so that count reads the table,
    sent rows included until the sweeper removes them). Elsewhere two queries, with
    the times measured against the app's clock.

    Args:
        using: the outbox's database alias.

    Raises:
        django.db.DatabaseError: the database failed.
    """
    connection = connections[using]
    if connection.vendor == "postgresql":
        now = "(statement_timestamp() + %(offset)s * interval '1 second')"
        table = connection.ops.quote_name(OutboxMessage._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(_PG_STATS_SQL.format(now=now, table=table), {"offset": clock.offset()})
            pending, due, dead, lag, oldest = cursor.fetchone()
        return OutboxStats(int(pending), int(due), int(dead), float(lag), float(oldest))
    moment = clock.app_now()
    due = clock.to_db(moment, connection)
    messages = OutboxMessage.objects.using(using)
    agg = messages.filter(state=OutboxState.PENDING).aggregate(
        pending=Count("pk"),
        due=Count("pk", filter=Q(available_at__lte=due)),
        first_due=Min("available_at", filter=Q(available_at__lte=due)),
        first_created=Min("created_at"),
    )

    def age(value: Any) -> float:
        if value is None:
            return 0.0
        return max(0.0, (moment - clock.from_db(value, connection)).total_seconds())

    return OutboxStats(
        pending=agg["pending"],
        due=agg["due"],
        dead=messages.filter(state=OutboxState.DEAD).count(),
        lag=age(agg["first_due"]),
        oldest_pending_age=age(agg["first_created"]),
    )


#: :attr:`PartitionStats.default_rows` counts at most this many rows.
DEFAULT_ROWS_BOUND = 1000


@dataclass(frozen=True)
class PartitionStats:
    """The day partitions ahead and the default partition now (docs/retention.md).

    Attributes:
        days_ahead: consecutive days after today (by the store's clock, UTC), from
            tomorrow on, that have a partition of their own. A claim whose window ends
            on a later day lands in the default partition.
        default_rows: records in the default partition, counted up to
            :data:`DEFAULT_ROWS_BOUND`: records claimed while their day had no
            partition, that the sweeper has not moved into their day (or deleted) yet.
    """

    days_ahead: int
    default_rows: int


#: The attached day partitions' names, and the default partition's first rows.
_PG_PARTITIONS_SQL = f"""
SELECT array(SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = to_regclass('{TABLE}') AND c.relname LIKE %s),
       (statement_timestamp() + %s * interval '1 second') AT TIME ZONE 'UTC'
"""


def partition_stats(using: str) -> PartitionStats | None:
    """The days ahead and the default partition of the record table on ``using``.

    Catalog queries and a count of at most :data:`DEFAULT_ROWS_BOUND` rows of the
    default partition: cheap enough for a scrape or a system check.

    Args:
        using: the record table's database alias.

    Returns:
        The :class:`PartitionStats`, or ``None`` when the record table is not a
        partitioned PostgreSQL table (nothing to report).

    Raises:
        django.db.DatabaseError: the database failed.
    """
    connection = connections[using]
    if not is_partitioned(connection):
        return None
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            _PG_PARTITIONS_SQL, [PARTITION_PREFIX.replace("_", r"\_") + "%", clock.offset()]
        )
        names, now = cursor.fetchone()
        cursor.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(%s)",
            [TABLE],
        )
        (schema,) = cursor.fetchone()
        cursor.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {quote(schema)}.{quote(DEFAULT_PARTITION)} "
            "LIMIT %s) AS waiting",
            [DEFAULT_ROWS_BOUND],
        )
        (default_rows,) = cursor.fetchone()
    days = {name.removeprefix(PARTITION_PREFIX) for name in names}
    ahead = 0
    while f"{now.date() + dt.timedelta(days=ahead + 1):%Y%m%d}" in days:
        ahead += 1
    return PartitionStats(days_ahead=ahead, default_rows=int(default_rows))


class StatementTimeout(Exception):
    """A statement of :func:`bounded_rows` ran past its time limit and was cancelled."""


def bounded_rows(
    using: str, sql: str, params: Sequence[Any], *, timeout: float
) -> list[tuple[Any, ...]]:
    """The rows of the read-only statement ``sql`` on ``using``, run for at most ``timeout``.

    The statement runs in a transaction of its own (a savepoint inside the caller's).
    On PostgreSQL it runs under a transaction-local ``statement_timeout`` of
    ``timeout`` seconds (whole milliseconds), and the setting is put back as it was
    before it, so a caller's enclosing transaction keeps its own; other databases have
    no such limit and run it to its end.

    Args:
        using: database alias.
        sql: one ``SELECT`` with ``%s`` placeholders.
        params: its parameters.
        timeout: seconds, positive.

    Raises:
        StatementTimeout: the statement was cancelled after ``timeout`` (from the
            database's error).
        django.db.DatabaseError: the database failed otherwise.
    """
    connection = connections[using]
    postgres = connection.vendor == "postgresql"
    try:
        with transaction.atomic(using=using), connection.cursor() as cursor:
            if postgres:
                cursor.execute("SELECT current_setting('statement_timeout')")
                (previous,) = cursor.fetchone()
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [f"{int(timeout * 1000)}"]
                )
            cursor.execute(sql, list(params))
            rows = list(cursor.fetchall())
            if postgres:
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
    except DatabaseError as exc:
        if sqlstate_of(exc) == QUERY_CANCELED:
            raise StatementTimeout(f"the statement ran past its {timeout:g} s limit") from exc
        raise
    return rows
