"""A failed delivery: retried after a backoff, or dead-lettered (docs/outbox.md).

The failure is written at once, fenced by the claim (its lease end and attempt count,
so a relay whose lease ran out cannot overwrite the relay that took the message over):
a retry ``available_at`` from exponential backoff with equal jitter (:func:`backoff`),
or ``dead`` after ``OUTBOX_MAX_ATTEMPTS`` attempts, with the error's traceback in
``last_error``.
"""

from __future__ import annotations

import logging
import random
import traceback
from typing import Any

from django.db import connections

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.outbox import outbox_store

logger = logging.getLogger("django_idempotency.outbox")


_LAST_ERROR_CHARS = 4000


def backoff(
    attempts: int,
    *,
    base: float,
    cap: float,
    rand: Any = random.random,
) -> float:
    """Seconds to wait before the next attempt: exponential growth, equal jitter.

    A uniformly random delay between half of and the whole of
    ``min(cap, base * 2 ** (attempts - 1))`` ("equal jitter"): retries of many failed
    messages spread out instead of arriving together, and the schedule keeps a floor,
    so the attempts allowed ride out a downstream outage of a known length
    (:func:`schedule`).

    Args:
        attempts: attempts made so far (1 after the first failure).
        base: the delay's bound after the first failure, in seconds.
        cap: the delay's largest bound, in seconds.
        rand: ``() -> float`` in ``[0, 1)``; injectable for tests.
    """
    ceiling = min(cap, base * 2.0 ** max(attempts - 1, 0))
    return ceiling / 2 + float(rand()) * ceiling / 2


def schedule(max_attempts: int, *, base: float, cap: float) -> list[tuple[int, float, float]]:
    """When each attempt of a message that keeps failing starts, and when it is dead.

    Args:
        max_attempts: attempts allowed (``OUTBOX_MAX_ATTEMPTS``).
        base: :func:`backoff`'s ``base`` (``OUTBOX_BACKOFF_BASE``), seconds.
        cap: :func:`backoff`'s ``cap`` (``OUTBOX_BACKOFF_CAP``), seconds.

    Returns:
        ``(attempt, earliest, latest)`` for attempts 1 to ``max_attempts``: the
        seconds after the first attempt at which it starts at the earliest and at the
        latest (the relay's poll interval and the handlers' time aside). The last
        attempt's failure dead-letters the message.
    """
    rows = []
    earliest = latest = 0.0
    for attempt in range(1, max_attempts + 1):
        rows.append((attempt, earliest, latest))
        earliest += backoff(attempt, base=base, cap=cap, rand=lambda: 0.0)
        latest += backoff(attempt, base=base, cap=cap, rand=lambda: 1.0)
    return rows


def _fenced(using: str, message: OutboxMessage) -> Any:
    """The message, if it is still pending under the claim this relay made.

    A claim is identified by the attempt count it reached and the lease end it set
    (``available_at``), which the relay's renewals only move later
    (``outbox.lease``); a relay that took the message over counted another attempt.
    """
    return OutboxMessage.objects.using(using).filter(
        pk=message.pk,
        state=OutboxState.PENDING,
        attempts=message.attempts,
        available_at__gte=clock.to_db(message.available_at, connections[using]),
    )


def fail(using: str, message: OutboxMessage, exc: Exception) -> str:
    """Record a failed delivery of ``message``: a retry after :func:`backoff`, or dead.

    Fenced by the claim; logged, and signalled (``signals.outbox_failed`` or
    ``signals.outbox_dead_lettered``) only when the fence held.

    Args:
        using: database alias.
        message: the claimed message whose handler raised.
        exc: what the handler raised.

    Returns:
        ``"dead"`` (dead-lettered), ``"failed"`` (retried later), or ``""`` when the
        fence did not hold (another relay's claim took the message over).
    """
    error = "".join(traceback.format_exception(exc))[-_LAST_ERROR_CHARS:]
    if message.attempts >= conf.outbox_max_attempts:
        updated = _fenced(using, message).update(
            state=OutboxState.DEAD, last_error=error, available_at=outbox_store(using).now()
        )
        if updated:
            logger.error(
                "outbox message %s (%s) dead after %s attempts: %s",
                message.pk,
                message.topic,
                message.attempts,
                exc,
            )
            signals.outbox_dead_lettered.send(
                message.topic, message_id=message.pk, attempts=message.attempts, error=exc
            )
            return "dead"
        return ""
    delay = backoff(message.attempts, base=conf.outbox_backoff_base, cap=conf.outbox_backoff_cap)
    retry_at = outbox_store(using).now(delay)
    if _fenced(using, message).update(last_error=error, available_at=retry_at):
        logger.warning(
            "outbox message %s (%s) failed (attempt %s), retry in %.1f s: %s",
            message.pk,
            message.topic,
            message.attempts,
            delay,
            exc,
        )
        signals.outbox_failed.send(
            message.topic,
            message_id=message.pk,
            attempts=message.attempts,
            error=exc,
            retry_in=delay,
        )
        return "failed"
    return ""
