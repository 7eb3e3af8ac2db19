"""The audit of keys minted per attempt (docs/operations.md#keys-minted-per-attempt).

A client that sends a new idempotency key with each retry defeats the protocol: every
attempt is a first execution. Its records show it: one principal, one endpoint, one
fingerprint (the same request) under several keys. :func:`keys_minted` finds those
groups among the records claimed within a window, per endpoint, with one bounded
statement: a range of the ``created_at`` index (every partition has it), the groups
aggregated in memory, the most recent ``limit`` listed, under a ``statement_timeout``
on PostgreSQL. Its cost grows with the records claimed in the window, not with the
table (docs/contributing/benchmarks.md).

Every record counts, claimed or completed: a released claim leaves no record, so each
one is an execution that ran or runs. Identical requests can be deliberate (two equal
orders): the groups are candidates for an operator, not proof.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.utils.dateparse import parse_datetime

from django_idempotency import signals
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import clock, reports
from django_idempotency.store.routing import record_database
from django_idempotency.store.tenants import dropped_during, targets, use_schema

#: The Celery task's name (``django_idempotency.tasks.audit_keys_minted``).
AUDIT_TASK = "django_idempotency.audit_keys_minted"

#: The groups of the window, then one row per endpoint counting them, then the most
#: recent groups: one statement (the groups are aggregated once).
_SQL = """
WITH grouped AS (
    SELECT endpoint, principal, fingerprint, COUNT(*) AS keys,
           SUM(CASE WHEN state = %s THEN 1 ELSE 0 END) AS completed,
           MIN(created_at) AS first_at, MAX(created_at) AS last_at
    FROM {table}
    WHERE created_at >= %s
    GROUP BY endpoint, principal, fingerprint
    HAVING COUNT(*) > 1
)
SELECT endpoint, NULL, NULL, COUNT(*), NULL, NULL, NULL FROM grouped GROUP BY endpoint
UNION ALL
SELECT * FROM (
    SELECT endpoint, principal, fingerprint, keys, completed, first_at, last_at
    FROM grouped ORDER BY last_at DESC LIMIT %s
) AS latest
"""


class AuditTooSlow(Exception):
    """The audit's statement ran past its ``statement_timeout``: audit a shorter window."""


@dataclass(frozen=True)
class Group:
    """One principal's identical requests under several keys at one endpoint.

    Attributes:
        principal: whose keys.
        endpoint: the endpoint (route pattern).
        fingerprint: the requests' fingerprint.
        keys: records (keys) in the group, within the window.
        completed: how many of them hold a stored response.
        first: when the first of them was claimed (UTC).
        last: when the last of them was claimed (UTC).
        schema: the tenant schema (django-tenants), ``None``: the connection's own.
    """

    principal: str
    endpoint: str
    fingerprint: str
    keys: int
    completed: int
    first: dt.datetime
    last: dt.datetime
    schema: str | None = None


@dataclass
class AuditReport:
    """What :func:`keys_minted` found on one database.

    Attributes:
        database: the alias.
        window: seconds audited, back from ``now``.
        now: the store's clock when the audit started (UTC).
        counts: groups per endpoint, every endpoint with at least one.
        groups: the most recent groups, at most ``limit`` per schema, newest first.
    """

    database: str
    window: float
    now: dt.datetime
    counts: Counter[str] = field(default_factory=Counter)
    groups: list[Group] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Groups found, over every endpoint."""
        return sum(self.counts.values())


def keys_minted(
    window: float,
    *,
    using: str | None = None,
    limit: int = 100,
    timeout: float = 30.0,
    send: bool = True,
) -> AuditReport:
    """Count and list the groups of records of one request under several keys.

    On a schema-per-tenant database (django-tenants) every schema that holds the
    record table is audited, one after the other; counts add up per endpoint.

    Args:
        window: seconds back from now (the store's clock) whose claims are audited.
        using: database alias (default: the router's choice for records).
        limit: groups listed at most (per schema); every group is counted.
        timeout: seconds the statement may run on PostgreSQL (``statement_timeout``).
        send: send the ``audited`` signal with the counts (the metrics gauges).

    Returns:
        The :class:`AuditReport`.

    Raises:
        ValueError: ``window``, ``limit`` or ``timeout`` is not positive.
        AuditTooSlow: the statement ran past ``timeout`` (nothing is sent).
        django.db.DatabaseError: the database failed.
    """
    if window <= 0 or limit < 1 or timeout <= 0:
        raise ValueError("window and timeout must be positive seconds, limit at least 1")
    using = using or record_database()
    connection = connections[using]
    now = clock.store_now(connection)
    report = AuditReport(using, window, now)
    since = clock.to_db(now - dt.timedelta(seconds=window), connection)
    for alias, schema in targets((using,)):
        try:
            with use_schema(alias, schema):
                rows = _query(alias, since, limit, timeout)
        except DatabaseError as exc:
            if not dropped_during(alias, schema, exc, "keys-minted audit"):
                raise
            continue
        for endpoint, principal, fingerprint, keys, completed, first, last in rows:
            if principal is None:
                report.counts[endpoint] += int(keys)
                continue
            report.groups.append(
                Group(
                    principal,
                    endpoint,
                    fingerprint,
                    int(keys),
                    int(completed),
                    _instant(first, connection),
                    _instant(last, connection),
                    schema,
                )
            )
    report.groups.sort(key=lambda group: group.last, reverse=True)
    if send:
        signals.audited.send(using, groups=dict(report.counts), window=window, using=using)
    return report


def _instant(value: Any, connection: Any) -> dt.datetime:
    """A ``created_at`` read by raw SQL as an aware UTC datetime (SQLite: a string)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    return clock.from_db(value, connection)


def _query(using: str, since: dt.datetime, limit: int, timeout: float) -> list[tuple[Any, ...]]:
    """Run the audit's statement, for at most ``timeout`` seconds where the store can bound it.

    Raises:
        AuditTooSlow: the statement ran past ``timeout`` and was cancelled.
        django.db.DatabaseError: the database failed otherwise.
    """
    connection = connections[using]
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    moment = connection.ops.adapt_datetimefield_value(since)
    params: list[Any] = [RecordState.COMPLETED.value, moment, limit]
    try:
        return reports.bounded_rows(using, _SQL.format(table=table), params, timeout=timeout)
    except reports.StatementTimeout as exc:
        raise AuditTooSlow(
            f"the audit of keys minted per attempt ran past its {timeout:g} s "
            "statement timeout: audit a shorter window"
        ) from exc
