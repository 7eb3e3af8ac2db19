"""What operators and the replay path do to records besides the protocol itself.

* :func:`end_leases` and :func:`forget_responses`: the admin's actions (docs/admin.md);
* :func:`peek`: what a claim would collide with, without claiming, for a request that
  may not run the view (DRF found no renderer for its ``Accept``) but may be answered
  from the record (docs/protocol.md).
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store.routing import record_database
from django_idempotency.store.rows import fetch, now_value
from django_idempotency.store.values import Existing, Scope


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
        IdempotencyRecord.objects.using(using)
        .filter(
            pk__in=list(record_ids),
            state=RecordState.CLAIMED,
            lease_until__gt=now_value(using),
        )
        .update(lease_until=F("created_at"))
    )


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
        The :class:`Existing` record that stands (completed inside its window, or
        claimed with a live lease, or claimed by a request with another fingerprint);
        ``None`` when a claim would own the key (no record, a record past its window,
        or an expired lease with the same fingerprint that would be taken over).

    Raises:
        django.db.DatabaseError: the database failed.
    """
    existing = fetch(scope, using=using)
    if existing is None:
        return None
    if existing.expired and (existing.completed or existing.lease_remaining <= 0):
        return None
    if (
        not existing.completed
        and existing.lease_remaining <= 0
        and existing.fingerprint == fingerprint
    ):
        return None
    return existing
