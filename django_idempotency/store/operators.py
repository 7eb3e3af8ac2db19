"""What operators and the replay path do to records besides the protocol itself.

* :func:`end_leases` and :func:`forget_responses`: the admin's actions (docs/admin.md),
  and :func:`with_live_lease`, the records the first would change;
* :func:`peek`: what a claim would collide with, without claiming, for a request that
  may not run the view (DRF found no renderer for its ``Accept``) but may be answered
  from the record (docs/protocol.md);
* what the admin and ``manage.py idempotency_records`` show: each record's condition
  (:func:`with_condition`, :func:`condition_of`, :func:`only_condition`: in flight,
  abandoned, completed, judged by the store's clock and, on PostgreSQL, by the owner's
  presence lock) and times as an operator reads them (:func:`relative`);
* :func:`with_key_hash`: the records whose key has the ``key_hash`` of a log line.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connections, transaction
from django.db.models import BooleanField, F, Q, QuerySet, Value
from django.db.models.expressions import RawSQL

from django_idempotency.logs import key_hash
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import clock, presence
from django_idempotency.store.claims import Verdict, judge
from django_idempotency.store.routing import record_database
from django_idempotency.store.rows import fetch, now_value
from django_idempotency.store.sql import TABLE, presence_key
from django_idempotency.store.values import Existing, Scope

#: A claim whose lease is live and whose owner, where presence is known, is present:
#: duplicates get 409 ``request-in-flight``.
IN_FLIGHT = "in flight"
#: A claim whose lease is over, or whose owner's session is gone (PostgreSQL, owner
#: presence): the next retry with the same request takes it over.
ABANDONED = "abandoned"
#: A completed record: retries get its stored response.
COMPLETED = "completed"
#: Every condition a record can be in (a released claim is deleted: it has no row).
CONDITIONS = (IN_FLIGHT, ABANDONED, COMPLETED)

_PREFIX = f'"{TABLE}".'
#: On PostgreSQL: the owner's session recorded its presence lock (``owner_pid``) and no
#: longer holds it, so a claim would take the record over at once. One scan of
#: ``pg_locks`` per query (an uncorrelated subquery); a one-bigint advisory lock shows
#: its key's high half in ``classid``, its low half in ``objid``, ``objsubid`` 1.
_OWNER_GONE_SQL = f"""(
    "{TABLE}"."owner_pid" IS NOT NULL
    AND ("{TABLE}"."owner_pid", {presence_key(_PREFIX)}) NOT IN (
        SELECT l.pid, (l.classid::bigint << 32) | l.objid::bigint
        FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    )
)"""


def end_leases(record_ids: list[int], *, using: str | None = None) -> int:
    """End the live leases of the claimed records ``record_ids`` now (operators).

    One UPDATE for the rows that are still claimed with a live lease, setting
    ``lease_until`` to ``created_at``: the lease is over, and the record says by whom
    (no lease ends where it began), so the takeover that follows is logged as an
    operator's (docs/observability.md). The next request with such a key and the same
    fingerprint takes the claim over (a phased view resumes after its recovery
    point); if the original request is still running, its completion is fenced off
    (:class:`LeaseLost`, its writes rolled back), unless it heartbeats first.

    Args:
        record_ids: primary keys of ``IdempotencyRecord`` rows.
        using: database alias; by default the router's choice for writes.

    Returns:
        How many leases were ended (completed records and leases that had already
        run out are left alone and not counted).
    """
    using = using or record_database()
    return int(
        with_live_lease(
            IdempotencyRecord.objects.using(using).filter(pk__in=list(record_ids))
        ).update(lease_until=F("created_at"))
    )


def with_live_lease(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """The records of ``queryset`` whose lease :func:`end_leases` would end now.

    Claimed, with a lease that has not run out nor been ended, by the store's clock;
    what the admin's confirmation and ``idempotency_records --end-lease`` list.
    """
    live: QuerySet[Any] = queryset.filter(
        state=RecordState.CLAIMED, lease_until__gt=now_value(queryset.db)
    )
    return live


def forget_responses(record_ids: list[int], *, using: str | None = None) -> int:
    """Delete the completed records ``record_ids``: their keys become new (operators).

    The next request with such a key runs the view again, a second time. Outbox
    messages that the first execution enqueued are kept (their link to the record is
    cleared); claimed records are left alone (end their lease instead).

    Args:
        record_ids: primary keys of ``IdempotencyRecord`` rows.
        using: database alias; by default the router's choice for writes.

    Returns:
        How many records were deleted.
    """
    using = using or record_database()
    rows = IdempotencyRecord.objects.using(using).filter(
        pk__in=list(record_ids), state=RecordState.COMPLETED
    )
    with transaction.atomic(using=using):
        _total, per_model = rows.delete()
    return int(per_model.get(IdempotencyRecord._meta.label, 0))


def peek(scope: Scope, fingerprint: str, *, using: str | None = None) -> Existing | None:
    """What :func:`claim` would collide with, without claiming anything.

    For a request that may not run the view (DRF found no renderer for its
    ``Accept``) but may still be answered from the record: a replay, a 422 or a 409.

    Returns:
        The :class:`Existing` record that stands (``claims.judge`` finds it a replay,
        a mismatch or in flight); ``None`` when a claim would own the key (no record,
        a record to reuse or to take over). Where a claim tests the owner's presence
        (``presence.tests``), so does this, with the claim's own test in the same
        statement: a claim whose owner's session is gone is one to take over here too,
        though its lease is live.

    Raises:
        django.db.DatabaseError: the database failed.
    """
    using = using or record_database()
    existing = fetch(scope, using=using, test_presence=presence.tests(connections[using]))
    if existing is None or judge(existing, fingerprint) in (Verdict.REUSE, Verdict.TAKE_OVER):
        return None
    return existing


def _owner_gone(using: str) -> Any:
    """Whether the owner is known to be gone, as an ORM boolean expression."""
    if connections[using].vendor != "postgresql":
        return Value(False, output_field=BooleanField())  # presence is PostgreSQL's only
    return RawSQL(_OWNER_GONE_SQL, [], output_field=BooleanField())


def with_condition(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """``queryset`` of records annotated ``owner_gone`` for :func:`condition_of`.

    ``owner_gone`` is true for a record whose owner held its presence lock and holds it
    no more (PostgreSQL); false wherever presence is unknown.
    """
    annotated: QuerySet[Any] = queryset.annotate(owner_gone=_owner_gone(queryset.db))
    return annotated


def only_condition(queryset: QuerySet[Any], condition: str) -> QuerySet[Any]:
    """The records of ``queryset`` in ``condition``, judged by the store's clock now.

    Raises:
        ValueError: ``condition`` is not one of :data:`CONDITIONS`.
    """
    if condition == COMPLETED:
        return queryset.filter(state=RecordState.COMPLETED)
    using = queryset.db
    live = Q(lease_until__gt=now_value(using))
    gone = _owner_gone(using)
    if condition == IN_FLIGHT:
        present = queryset.alias(_owner_gone=gone).filter(_owner_gone=False)
        in_flight: QuerySet[Any] = present.filter(live, state=RecordState.CLAIMED)
        return in_flight
    if condition == ABANDONED:
        claimed = queryset.alias(_owner_gone=gone).filter(state=RecordState.CLAIMED)
        abandoned: QuerySet[Any] = claimed.filter(~live | Q(_owner_gone=True))
        return abandoned
    raise ValueError(f"unknown condition {condition!r}; one of {', '.join(CONDITIONS)}")


#: ``logs.key_hash`` of the ``key`` column, in SQL (PostgreSQL).
_KEY_HASH_SQL = "left(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 12)"


def with_key_hash(queryset: QuerySet[Any], wanted: str) -> QuerySet[Any]:
    """The records of ``queryset`` whose key's ``logs.key_hash`` is ``wanted``.

    Args:
        queryset: records (``IdempotencyRecord``), already filtered as the caller wants.
        wanted: 12 lowercase hexadecimal digits, as a log line's ``key_hash`` shows them.

    Returns:
        A queryset of ``queryset``'s records: on PostgreSQL one statement that hashes
        the keys in SQL; elsewhere the keys of ``queryset`` are read and hashed in
        Python, and the matching records selected by primary key.
    """
    if connections[queryset.db].vendor == "postgresql":
        hashed: QuerySet[Any] = queryset.alias(_key_hash=RawSQL(_KEY_HASH_SQL, []))
        return hashed.filter(_key_hash=wanted)
    ids = [
        pk for pk, key in queryset.values_list("pk", "key").iterator() if key_hash(key) == wanted
    ]
    found: QuerySet[Any] = queryset.filter(pk__in=ids)
    return found


def condition_of(record: IdempotencyRecord, now: dt.datetime) -> str:
    """The condition of ``record`` at ``now``: in flight, abandoned or completed.

    Returns :data:`IN_FLIGHT`, :data:`ABANDONED` or :data:`COMPLETED`.

    Args:
        record: a record, read through :func:`with_condition` for owner presence
            (without it, only the lease decides).
        now: the store's clock (``clock.store_now``), aware.
    """
    if record.state == RecordState.COMPLETED:
        return COMPLETED
    lease_until = clock.from_db(record.lease_until, connections[record._state.db or "default"])
    if lease_until <= now or getattr(record, "owner_gone", False):
        return ABANDONED
    return IN_FLIGHT


def relative(moment: dt.datetime, now: dt.datetime) -> str:
    """How far ``moment`` is from ``now``, as an operator reads it.

    ``"in 42 s"``, ``"3 min ago"``, ``"2 h ago"``, ``"in 3 d"``; ``"now"`` within a
    second. Rounded down to the unit: seconds under a minute, minutes under an hour,
    hours under two days, days beyond.

    Args:
        moment: an aware datetime.
        now: an aware datetime.
    """
    seconds = (moment - now).total_seconds()
    size = abs(seconds)
    if size < 1:
        return "now"
    if size < 60:
        amount = f"{int(size)} s"
    elif size < 3600:
        amount = f"{int(size // 60)} min"
    elif size < 48 * 3600:
        amount = f"{int(size // 3600)} h"
    else:
        amount = f"{int(size // 86400)} d"
    return f"in {amount}" if seconds > 0 else f"{amount} ago"
