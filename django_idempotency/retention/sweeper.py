"""Sweeping: forget each record once its own retention window and lease are over.

:func:`sweep` is the one entry point of the Celery task and of the
``idempotency_sweep`` management command. With ``now`` the store's clock, it:

* PostgreSQL, partitioned record table (partitioned by ``sweep_after``, the day each
  record's window ends): creates the partitions of today and of every day a claim made
  now may need (``MAX_RETENTION`` ahead, plus ``PARTITIONS_AHEAD`` days), moving into
  each the records the default partition holds of its day (``moved``); then drops each
  day partition that ended before today, unless a record in it is still inside its
  window (``expires_at > now``: a takeover, a heartbeat or a late completion pushed it)
  or holds a live lease; such a day is kept (``held``) until the next run. Each creation
  and drop holds the record table's ACCESS EXCLUSIVE lock for a moment, waited for at
  most ``LOCK_TIMEOUT``: claims wait for it meanwhile, and a day whose lock is not
  granted in time is reported in ``errors`` and tried again next run. Last, deletes
  the default partition's records past their window and lease, in batches
  (``deleted_records``). A constant cost whatever the row count: one index probe per
  old partition.
* Other databases, or a plain PostgreSQL table: deletes the records whose window and
  lease are both over, in batches of ``SWEEP_BATCH_SIZE`` rows, each its own
  transaction.
* Everywhere: deletes, in batches, outbox messages sent more than
  ``OUTBOX_RETENTION`` ago.

A record is therefore stored for its own window plus at most about a day (the rest of
its partition's day, and the time to the next sweep), whatever other views use. On
PostgreSQL a transaction-scoped advisory lock, held for the sweep by a transaction of
its own, makes a concurrent second run a no-op (``skipped``); it is safe behind a
transaction pooler (docs/deployment.md). Every step is idempotent, so re-running is
always safe.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q, QuerySet

from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState, RecordState
from django_idempotency.retention import partitions
from django_idempotency.store import clock
from django_idempotency.store.catalog import has_advisory_locks, is_partitioned
from django_idempotency.store.clock import store_now
from django_idempotency.store.routing import record_database
from django_idempotency.store.schema.functions import SCHEMA_SWEEP_LOCK, SWEEP_LOCK
from django_idempotency.store.schema.tables import days_ahead
from django_idempotency.store.sql import TABLE
from django_idempotency.store.tenants import (
    copy_of,
    current_schema,
    dropped_during,
    label,
    targets,
    use_schema,
)

logger = logging.getLogger("django_idempotency")

#: The name of the Celery task that runs the sweeper (``django_idempotency.tasks.sweep``).
SWEEP_TASK = "django_idempotency.sweep"

#: Seconds the creation or the drop of a day partition waits for the record table's
#: lock before giving up until the next run. Claims queue behind a waiting lock request,
#: so this is also the longest a claim waits for the sweeper.
LOCK_TIMEOUT = 1.0


@dataclass
class SweepReport:
    """What a sweep did, or would do with ``dry_run``.

    Attributes:
        database: the database alias swept.
        method: ``"partitions"`` (drop whole days) or ``"delete"`` (batched DELETE).
        dry_run: nothing was changed; the lists and counts say what would be.
        skipped: another sweeper held the lock; this run did nothing.
        now: the store's clock when the sweep started (UTC).
        cutoff: partitions of days ending at or before this instant (the start of
            today, UTC) may be dropped; rows whose window and lease ended before it
            may be deleted (``now``).
        created: days whose partition was (or would be) created.
        moved: records moved from the default partition into the days created.
        dropped: partitions dropped (or to drop), with their estimated row counts.
        held: partitions past their day kept because a record in them is still
            inside its window or lease.
        deleted_records: records deleted (or to delete): by the batched path, or from
            the default partition of the partitioned table.
        deleted_outbox: sent outbox messages deleted (or to delete).
        errors: days that could not be created and partitions that could not be
            dropped this time (their lock was not granted in time), with the reason.
        seconds: wall time of the sweep.
        schema: the tenant schema swept (django-tenants); ``None``: the connection's own.
    """

    database: str
    method: str
    dry_run: bool
    now: dt.datetime
    cutoff: dt.datetime
    skipped: bool = False
    created: list[dt.date] = field(default_factory=list)
    moved: int = 0
    dropped: list[partitions.Partition] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    deleted_records: int = 0
    deleted_outbox: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    schema: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (dates and datetimes as ISO 8601 strings)."""
        data = asdict(self)
        data["now"], data["cutoff"] = self.now.isoformat(), self.cutoff.isoformat()
        data["created"] = [day.isoformat() for day in self.created]
        data["dropped"] = [
            {"name": p.name, "day": p.day.isoformat(), "rows": p.rows} for p in self.dropped
        ]
        return data


def start_of_day(moment: dt.datetime) -> dt.datetime:
    """00:00 UTC of the day holding ``moment``."""
    return moment.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def sweep(
    using: str | None = None, *, dry_run: bool = False, schema: str | None = None
) -> SweepReport:
    """Drop or delete records past their own window and lease; sweep sent outbox messages.

    Args:
        using: database alias; by default the router's choice for records.
        dry_run: change nothing; report what would be created, dropped or deleted.
        schema: on a schema-per-tenant database (django-tenants), the schema to sweep
            (``store.tenants.schemas`` lists them); ``None``: the connection's own.

    Returns:
        A :class:`SweepReport`. A partition whose drop timed out waiting for its lock
        is listed in ``errors``, one still holding a live record in ``held``; both are
        tried again by the next run.

    Raises:
        django.db.DatabaseError: the database failed (anything but a lock timeout).
    """
    using = using or record_database()
    with use_schema(using, schema):
        return _sweep(using, dry_run, schema)


def sweep_all(using: str | None = None, *, dry_run: bool = False) -> list[SweepReport]:
    """:func:`sweep` of every schema of ``using`` that holds records, one after the other.

    One report on a database without tenant schemas; on a schema-per-tenant database
    (django-tenants), one per schema that holds the record table, by schema name
    (docs/tenants.md).

    Args:
        using: database alias; by default the router's choice for records.
        dry_run: change nothing; report what would be created, dropped or deleted.

    A tenant schema dropped while the run reaches it (its tenant deleted) is skipped
    and logged; the other schemas are swept. Only tenants django-tenants knows (rows of
    its ``TENANT_MODEL``, and its public schema) are swept: another schema holding a
    table of that name (a template, a backup) is not.

    Returns:
        The :class:`SweepReport` of each schema swept, in order (``schema`` names it).

    Raises:
        django.db.DatabaseError: the database failed; the schemas after it are not swept.
    """
    using = using or record_database()
    reports = []
    for alias, name in targets((using,)):
        try:
            reports.append(sweep(alias, dry_run=dry_run, schema=name))
        except DatabaseError as exc:
            if not dropped_during(alias, name, exc, "idempotency sweep"):
                raise
    return reports


def _sweep(using: str, dry_run: bool, schema: str | None) -> SweepReport:
    started = time.monotonic()
    connection = connections[using]
    where = label(using, schema)
    now = store_now(connection)
    method = "partitions" if is_partitioned(connection) else "delete"
    cutoff = start_of_day(now) if method == "partitions" else now
    report = SweepReport(using, method, dry_run, now, cutoff, schema=schema)
    with _exclusive(connection, dry_run, schema) as acquired:
        if not acquired:
            report.skipped = True
            logger.info("idempotency sweep skipped: another sweeper is running on %s", where)
        else:
            if method == "partitions":
                _sweep_partitions(connection, report)
            else:
                report.deleted_records = _delete(_forgettable(using, now), dry_run=dry_run)
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
            where,
            " (dry run)" if dry_run else "",
            len(report.created),
            len(report.dropped),
            report.deleted_records,
            report.deleted_outbox,
        )
    return report


@contextmanager
def _exclusive(
    connection: BaseDatabaseWrapper, dry_run: bool, schema: str | None
) -> Iterator[bool]:
    """One sweeper at a time per PostgreSQL database, or per tenant schema.

    The lock is transaction-scoped (``pg_try_advisory_xact_lock``) and held by a
    transaction of its own, on a second connection, for the whole sweep: the sweep's own
    statements run in transactions of their own (one per day created or dropped, one per
    batch deleted), which end before the sweep does. An open transaction keeps one
    server session, even behind a transaction pooler (PgBouncer), so the lock is taken
    and released (by the transaction's end) on the same session, never leaked to another
    client's; a sweeper that dies drops its connection, which ends the transaction and
    the lock. That transaction takes no table lock: the creations and drops never wait
    for it. On a schema-per-tenant database (django-tenants) a sweep takes the lock of
    the schema whose record table it sweeps (``SCHEMA_SWEEP_LOCK``, the schema name's
    hash), found the way the sweep's statements find the table (the second connection
    runs in the same schema), so sweeps of two schemas never skip each other and two
    sweeps of one schema never run together, whichever schema they were asked for.
    """
    if dry_run or not has_advisory_locks(connection):
        yield True
        return
    holder = copy_of(connection)
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            if current_schema(holder) is None:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(SWEEP_LOCK))
            else:
                cursor.execute(
                    "SELECT pg_try_advisory_xact_lock(%s, hashtext(coalesce(("
                    "SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)), %s)))",
                    [SCHEMA_SWEEP_LOCK, TABLE, schema or ""],
                )
            (acquired,) = cursor.fetchone()
        yield bool(acquired)
    finally:
        with suppress(DatabaseError):  # never hide the original error
            holder.rollback()  # ends the transaction: releases the lock
        holder.close()


def _forgettable(using: str, now: dt.datetime) -> QuerySet[IdempotencyRecord]:
    """Records past their window and their lease: no claim can need them any more."""
    now = clock.to_db(now, connections[using])
    return IdempotencyRecord.objects.using(using).filter(
        Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now), expires_at__lte=now
    )


def _sweep_partitions(connection: BaseDatabaseWrapper, report: SweepReport) -> None:
    existing = partitions.list_partitions(connection)
    attached = {p.day for p in existing if p.attached}
    today = report.now.date()
    for offset in range(days_ahead() + 1):
        day = today + dt.timedelta(days=offset)
        if day in attached:
            continue
        if report.dry_run:
            report.created.append(day)
            continue
        try:
            moved = partitions.ensure(connection, day, lock_timeout=LOCK_TIMEOUT)
        except DatabaseError as exc:
            _failed(report, partitions.partition_name(day), "create", exc)
            continue
        if moved is not None:
            report.created.append(day)
            report.moved += moved
    for partition in existing:
        if partition.day >= report.cutoff.date():
            continue
        if report.dry_run:
            if partition.attached and partitions.holds_live_records(
                connection, partition, report.now
            ):
                report.held.append(partition.name)
            else:
                report.dropped.append(partition)
            continue
        try:
            dropped = partitions.drop(connection, partition, lock_timeout=LOCK_TIMEOUT)
        except DatabaseError as exc:
            _failed(report, partition.name, "drop", exc)
            continue
        if dropped:
            report.dropped.append(partition)
        else:
            report.held.append(partition.name)
    report.deleted_records = partitions.purge_default(
        connection,
        report.now,
        batch=conf.sweep_batch_size,
        dry_run=report.dry_run,
    )


def _failed(report: SweepReport, name: str, what: str, exc: DatabaseError) -> None:
    """Report a day the sweep could not create or drop (its savepoint rolled back)."""
    report.errors.append(f"{name}: {exc}".strip())
    logger.warning("idempotency sweep: could not %s %s: %s", what, name, exc)


def _delete(queryset: QuerySet[Any], *, dry_run: bool) -> int:
    """Delete ``queryset``'s rows, ``SWEEP_BATCH_SIZE`` per statement.

    Each batch is its own transaction (outside an atomic block), so locks stay short
    and an interrupted run keeps what it did. Bypasses the deletion collector: nothing
    cascades from these rows (the outbox's link to a record has no constraint).

    The DELETE carries ``queryset``'s conditions itself, not only the batch's ids: a row
    a concurrent writer holds (a late completion, a heartbeat pushing its window) is
    waited for, then tested again as that writer left it (PostgreSQL re-evaluates the
    DELETE's own conditions on the updated row, not those of the subquery that chose
    the batch), so a record made live meanwhile is kept.
    """
    if dry_run:
        return queryset.count()
    using = queryset.db
    batch = max(conf.sweep_batch_size, 1)
    ordered = queryset.order_by()
    total = 0
    while True:
        if connections[using].features.allow_sliced_subqueries_with_in:
            chunk: Any = ordered.values("pk")[:batch]
        else:  # MySQL: no LIMIT in an IN subquery
            chunk = list(ordered.values_list("pk", flat=True)[:batch])
        deleted = int(ordered.filter(pk__in=chunk)._raw_delete(using))
        total += deleted
        if deleted < batch:
            return total
