"""Sweeping (SPEC §6): forget what is past the longest retention window.

:func:`sweep` is the one entry point of the Celery task and of the
``idempotency_sweep`` management command. With ``W = max(MAX_RETENTION, RETENTION)``
and ``cutoff`` the start (UTC) of the day holding ``now - W``, it:

* PostgreSQL, partitioned record table: creates the partitions of today and
  ``PARTITIONS_AHEAD`` days ahead, then detaches and drops every day partition before
  ``cutoff``: a constant cost whatever the row count.
* Other databases, or a plain PostgreSQL table: deletes the records created before
  ``cutoff`` in batches of ``SWEEP_BATCH_SIZE`` rows, each its own transaction.
* Everywhere: deletes, in batches, outbox messages sent more than
  ``OUTBOX_RETENTION`` ago.

Inside a kept day, a record past its own ``expires_at`` is already treated as absent
by the claim. On PostgreSQL a session advisory lock makes a concurrent second run a
no-op (``skipped``); every step is idempotent, so re-running is always safe.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import DatabaseError, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet

from . import clock, partitions
from ._pg_partitioned import SWEEP_LOCK, is_partitioned
from .conf import conf
from .models import IdempotencyRecord, OutboxMessage, OutboxState

logger = logging.getLogger("django_idempotency")

#: Seconds a partition drop waits for its lock before giving up until the next run.
LOCK_TIMEOUT = 5.0


@dataclass
class SweepReport:
    """What a sweep did, or would do with ``dry_run``.

    Attributes:
        database: the database alias swept.
        method: ``"partitions"`` (drop whole days) or ``"delete"`` (batched DELETE).
        dry_run: nothing was changed; the lists and counts say what would be.
        skipped: another sweeper held the lock; this run did nothing.
        now: the store's clock when the sweep started (UTC).
        cutoff: records created before this instant are dropped or deleted (UTC).
        created: days whose partition was (or would be) created.
        dropped: partitions dropped (or to drop), with their estimated row counts.
        deleted_records: records deleted (or to delete) by the batched path.
        deleted_outbox: sent outbox messages deleted (or to delete).
        errors: partitions that could not be dropped this time, with the reason.
        seconds: wall time of the sweep.
    """

    database: str
    method: str
    dry_run: bool
    now: dt.datetime
    cutoff: dt.datetime
    skipped: bool = False
    created: list[dt.date] = field(default_factory=list)
    dropped: list[partitions.Partition] = field(default_factory=list)
    deleted_records: int = 0
    deleted_outbox: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (dates and datetimes as ISO 8601 strings)."""
        data = asdict(self)
        data["now"], data["cutoff"] = self.now.isoformat(), self.cutoff.isoformat()
        data["created"] = [day.isoformat() for day in self.created]
        data["dropped"] = [
            {"name": p.name, "day": p.day.isoformat(), "rows": p.rows} for p in self.dropped
        ]
        return data


def database_for_sweep() -> str:
    """The database alias the router picks for writing idempotency records."""
    return router.db_for_write(IdempotencyRecord) or "default"


def store_now(connection: BaseDatabaseWrapper) -> dt.datetime:
    """Now by the store's clock (``django_idempotency.clock``), timezone-aware UTC."""
    if connection.vendor != "postgresql":
        return clock.app_now()
    with connection.cursor() as cursor:
        # Read as UTC in SQL: exact whatever the session's time zone (USE_TZ = False
        # sets it to TIME_ZONE, and Django then strips the offset).
        cursor.execute(
            "SELECT (statement_timestamp() + %s * interval '1 second') AT TIME ZONE 'UTC'",
            [clock.offset()],
        )
        (now,) = cursor.fetchone()
    return clock.utc_from_naive(now)


def retention_window() -> float:
    """Seconds after which a record is swept: ``max(MAX_RETENTION, RETENTION)``."""
    return max(conf.max_retention, conf.retention)


def cutoff_for(now: dt.datetime) -> dt.datetime:
    """Start (UTC) of the day holding ``now - retention_window()``.

    Every whole day before it ended more than the window ago.
    """
    oldest = (now - dt.timedelta(seconds=retention_window())).astimezone(dt.UTC)
    return oldest.replace(hour=0, minute=0, second=0, microsecond=0)


def sweep(using: str | None = None, *, dry_run: bool = False) -> SweepReport:
    """Drop or delete records past the retention window; sweep sent outbox messages.

    Args:
        using: database alias; by default the router's choice for records.
        dry_run: change nothing; report what would be created, dropped or deleted.

    Returns:
        A :class:`SweepReport`. A partition whose drop timed out waiting for its lock
        is listed in ``errors`` and retried by the next run.

    Raises:
        django.db.DatabaseError: the database failed (anything but a lock timeout).
    """
    started = time.monotonic()
    using = using or database_for_sweep()
    connection = connections[using]
    now = store_now(connection)
    method = "partitions" if is_partitioned(connection) else "delete"
    report = SweepReport(using, method, dry_run, now, cutoff_for(now))
    with _exclusive(connection, dry_run) as acquired:
        if not acquired:
            report.skipped = True
            logger.info("idempotency sweep skipped: another sweeper is running on %s", using)
        else:
            if method == "partitions":
                _sweep_partitions(connection, report)
            else:
                records = IdempotencyRecord.objects.using(using).filter(
                    created_at__lt=clock.to_db(report.cutoff, connection)
                )
                report.deleted_records = _delete(records, dry_run=dry_run)
            sent = OutboxMessage.objects.using(using).filter(
                state=OutboxState.SENT,
                sent_at__lt=clock.to_db(
                    now - dt.timedelta(seconds=conf.outbox_retention), connection
                ),
            )
            report.deleted_outbox = _delete(sent, dry_run=dry_run)
    report.seconds = time.monotonic() - started
    if not report.skipped:
        logger.info(
            "idempotency sweep on %s%s: %d partitions created, %d dropped, %d records "
            "and %d outbox messages deleted",
            using,
            " (dry run)" if dry_run else "",
            len(report.created),
            len(report.dropped),
            report.deleted_records,
            report.deleted_outbox,
        )
    return report


@contextmanager
def _exclusive(connection: BaseDatabaseWrapper, dry_run: bool) -> Iterator[bool]:
    """One sweeper at a time per PostgreSQL database (a session advisory lock)."""
    if dry_run or connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", list(SWEEP_LOCK))
        (acquired,) = cursor.fetchone()
    if not acquired:
        yield False
        return
    try:
        yield True
    except BaseException:
        # Inside a failed transaction the unlock cannot run; the lock then lasts until
        # the session ends (this session may still re-enter it).
        if not connection.needs_rollback:
            with suppress(DatabaseError):  # never hide the original error
                _unlock(connection)
        raise
    _unlock(connection)


def _unlock(connection: BaseDatabaseWrapper) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", list(SWEEP_LOCK))


def _sweep_partitions(connection: BaseDatabaseWrapper, report: SweepReport) -> None:
    existing = partitions.list_partitions(connection)
    attached = {p.day for p in existing if p.attached}
    today = report.now.date()
    for offset in range(max(conf.partitions_ahead, 0) + 1):
        day = today + dt.timedelta(days=offset)
        if day in attached:
            continue
        if report.dry_run or partitions.ensure(connection, day):
            report.created.append(day)
    for partition in existing:
        if partition.day >= report.cutoff.date():
            continue
        if not report.dry_run:
            try:
                partitions.drop(connection, partition, lock_timeout=LOCK_TIMEOUT)
            except DatabaseError as exc:
                if connection.in_atomic_block:
                    raise
                report.errors.append(f"{partition.name}: {exc}".strip())
                logger.warning("idempotency sweep: could not drop %s: %s", partition.name, exc)
                continue
        report.dropped.append(partition)


def _delete(queryset: QuerySet[Any], *, dry_run: bool) -> int:
    """Delete ``queryset``'s rows, ``SWEEP_BATCH_SIZE`` per statement.

    Each batch is its own transaction (outside an atomic block), so locks stay short
    and an interrupted run keeps what it did. Bypasses the deletion collector: nothing
    cascades from these rows (the outbox's link to a record has no constraint).
    """
    if dry_run:
        return queryset.count()
    using = queryset.db
    batch = max(conf.sweep_batch_size, 1)
    model = queryset.model
    ordered = queryset.order_by()
    total = 0
    while True:
        if connections[using].features.allow_sliced_subqueries_with_in:
            chunk: Any = ordered.values("pk")[:batch]
        else:  # MySQL: no LIMIT in an IN subquery
            chunk = list(ordered.values_list("pk", flat=True)[:batch])
        deleted = int(model._default_manager.using(using).filter(pk__in=chunk)._raw_delete(using))
        total += deleted
        if deleted < batch:
            return total
