"""The relay's first step: claim a batch of due messages (docs/outbox.md).

The store (``store.outbox``) claims the oldest due ``pending`` messages: each claim
counts an attempt and moves the message's ``available_at`` to the end of the relay
lease, committed at once, so no message is claimed twice while its lease runs. A due
message whose last allowed attempt never reported back is dead-lettered instead, and
reported here. Messages claimed but never handed to a handler are handed back, due at
once (:func:`hand_back`).
"""

from __future__ import annotations

import logging

from django.db import connections, transaction
from django.db.models import F

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.outbox import Claimed, claims_of, outbox_store

logger = logging.getLogger("django_idempotency.outbox")

__all__ = ["Claimed", "claim_due", "hand_back"]


def claim_due(using: str, limit: int, lease: float) -> tuple[list[Claimed], int]:
    """Claim due messages; returns them in delivery order, and how many were buried.

    Args:
        using: database alias.
        limit: most messages claimed.
        lease: seconds the relay holds them (``OUTBOX_RELAY_LEASE``).

    Raises:
        django.db.DatabaseError: the database failed; nothing was claimed.
    """
    claimed, buried = outbox_store(using).claim_due(limit, lease, conf.outbox_max_attempts)
    for pk, topic, attempts in buried:
        logger.error("outbox message %s (%s) dead: attempts used up", pk, topic)
        signals.outbox_dead_lettered.send(topic, message_id=pk, attempts=attempts, error=None)
    return claimed, len(buried)


def hand_back(using: str, messages: list[OutboxMessage]) -> None:
    """Return claimed messages no handler saw: due now, the claim's attempt undone.

    Fenced by the claim (its attempt count, and its lease end or a renewal's later
    one): a message another relay claimed after this relay's lease ran out is left
    alone.
    """
    if not messages:
        return
    now = outbox_store(using).now()
    with transaction.atomic(using=using):  # one commit
        for (end, attempts), ids in claims_of(messages).items():
            OutboxMessage.objects.using(using).filter(
                pk__in=ids,
                state=OutboxState.PENDING,
                # still this claim: its attempt, its lease end or a renewal's later one
                attempts=attempts,
                available_at__gte=clock.to_db(end, connections[using]),
            ).update(attempts=F("attempts") - 1, available_at=now)
