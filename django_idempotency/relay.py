"""The outbox relay: claim due messages, call their handlers, mark them (docs/outbox.md).

:func:`deliver_batch` is one pass:

1. **Claim**, in one short statement: the oldest due ``pending`` messages are locked
   with ``SELECT ... FOR UPDATE SKIP LOCKED`` (PostgreSQL), their ``attempts`` is
   incremented and their ``available_at`` moved to the end of the relay lease. The
   transaction commits at once; concurrent relays skip the locked rows and then see
   them as not due, so no message is claimed twice while its lease runs.
2. **Deliver**, outside any transaction the relay holds: each handler is called with
   the message and its dedup key.
3. **Mark**, fenced by the claim (its lease end and attempt count, so a relay whose
   lease ran out cannot overwrite the relay that took the message over): a failure at
   once, with a retry ``available_at`` from exponential backoff with full jitter, or
   ``dead`` after ``OUTBOX_MAX_ATTEMPTS`` attempts; the delivered messages together,
   ``sent``, in one UPDATE at the end of the batch.

A relay killed between 1 and 3 leaves its messages ``pending`` with ``available_at``
at the lease's end: they are delivered again after it, including those of the batch
it had already delivered. Delivery is therefore at least once; the dedup key makes it
effectively once downstream. Smaller batches shrink what a crash redelivers; larger
ones cost fewer commits per message (benchmarks/relay.py). On SQLite (no SKIP LOCKED)
the claim is a conditional UPDATE per message: concurrent relays stay correct but
serialise on the database's single writer, so run one relay. Clock: the store's
(``django_idempotency.clock``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import time
import traceback
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL
from django.dispatch import Signal

from . import clock, handlers
from ._pg import pg_now
from .conf import conf
from .models import OutboxMessage, OutboxState

logger = logging.getLogger("django_idempotency.outbox")

#: Sent with ``sender`` = the topic and ``message_id``, ``attempts`` and ``lag``
#: (seconds from ``created_at`` to now), for the delivery-lag metric
#: (docs/observability.md).
delivered = Signal()
#: A delivery failed and will be retried: ``message_id``, ``attempts``, ``error``,
#: ``retry_in`` (seconds).
failed = Signal()
#: A delivery failed for the last time; the message is ``dead``: ``message_id``,
#: ``attempts``, ``error``.
dead_lettered = Signal()

_LAST_ERROR_CHARS = 4000

_PG_CLAIM_SQL = """
WITH due AS (
    SELECT id, available_at FROM django_idempotency_outbox
    WHERE state = 'pending' AND available_at <= {now}
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE django_idempotency_outbox AS m
SET attempts = m.attempts + 1, available_at = {now} + %(lease)s * interval '1 second'
FROM due
WHERE m.id = due.id
RETURNING m.id, m.topic, m.payload, m.dedup_key, m.attempts,
          m.available_at AT TIME ZONE 'UTC', m.created_at AT TIME ZONE 'UTC',
          m.record_id, due.available_at AS due_at,
          EXTRACT(EPOCH FROM {now} - m.created_at)::float8 AS age
"""


def backoff(
    attempts: int,
    *,
    base: float,
    cap: float,
    rand: Any = random.random,
) -> float:
    """Seconds to wait before the next attempt: exponential growth, full jitter.

    A uniformly random delay between 0 and ``min(cap, base * 2 ** (attempts - 1))``
    ("full jitter"), so retries of many failed messages spread out instead of
    arriving together.

    Args:
        attempts: attempts made so far (1 after the first failure).
        base: upper bound after the first failure, in seconds.
        cap: largest upper bound, in seconds.
        rand: ``() -> float`` in ``[0, 1)``; injectable for tests.
    """
    ceiling = min(cap, base * 2.0 ** max(attempts - 1, 0))
    return float(rand()) * ceiling


@dataclass
class _Claimed:
    message: OutboxMessage
    age: float


def now(using: str, plus_seconds: float = 0.0) -> Any:
    """Now (+ ``plus_seconds``) by the store's clock, as a value for ORM queries."""
    if connections[using].vendor == "postgresql":
        sql, params = pg_now()
        return RawSQL(f"({sql} + %s * interval '1 second')", [*params, plus_seconds])
    return clock.to_db(clock.app_now() + dt.timedelta(seconds=plus_seconds), connections[using])


def deliver_batch(
    batch_size: int | None = None, *, using: str | None = None, lease: float | None = None
) -> int:
    """Claim up to ``batch_size`` due messages and deliver them; one relay pass.

    Messages are handled in ``(available_at, id)`` order within the batch. No order
    holds across batches, relays or retries (a failed message is retried later, after
    newer ones). Each delivered message is marked sent as soon as its handler returns.
    Once half the lease has gone, the relay stops starting handlers and hands the rest
    of the batch back (due at once), so a long batch never outlives its lease. Due
    messages whose last allowed attempt never reported back (the relay died, or the
    handler outlived the lease) are dead-lettered first.

    Args:
        batch_size: most messages claimed (default ``OUTBOX_BATCH_SIZE``).
        using: database alias (default: the router's choice for ``OutboxMessage``).
        lease: seconds the claimed messages are held (default ``OUTBOX_RELAY_LEASE``).

    Returns:
        Messages handled: sent, retried or dead-lettered. 0: nothing was due.

    Raises:
        django.db.DatabaseError: the database failed; claimed messages stay leased
            and are delivered after the lease.
    """
    handlers.autodiscover()
    using = using or handlers.database_for_write()
    limit = conf.outbox_batch_size if batch_size is None else int(batch_size)
    lease = conf.outbox_relay_lease if lease is None else float(lease)
    if limit < 1:
        raise ValueError(f"batch_size must be at least 1, not {limit}")
    started = time.monotonic()
    _bury_abandoned(using)
    claimed = _claim(using, limit, lease)
    handled = 0
    for item in claimed:
        if time.monotonic() - started > lease / 2:
            _hand_back(using, [c.message for c in claimed[handled:]])
            break
        if _deliver(using, item):
            # Marked at once, not at the end of the batch: a later handler that
            # outlives the lease must not make this one claimable (and delivered) again.
            _mark_sent(using, [item])
        handled += 1
    return handled


def deliver_due(
    batch_size: int | None = None, *, using: str | None = None, max_batches: int = 10
) -> int:
    """Run :func:`deliver_batch` until a batch comes back short, at most ``max_batches``.

    Returns:
        Messages handled in all batches.
    """
    limit = conf.outbox_batch_size if batch_size is None else int(batch_size)
    total = 0
    for _ in range(max_batches):
        handled = deliver_batch(limit, using=using)
        total += handled
        if handled < limit:
            break
    return total


def _claim(using: str, limit: int, lease: float) -> list[_Claimed]:
    connection = connections[using]
    if connection.vendor == "postgresql":
        now_sql = "(statement_timestamp() + %(offset)s * interval '1 second')"
        params = {"offset": clock.offset(), "limit": limit, "lease": lease}
        with connection.cursor() as cursor:
            cursor.execute(_PG_CLAIM_SQL.format(now=now_sql), params)
            rows = cursor.fetchall()
        claimed = []
        for row in sorted(rows, key=lambda r: (r[8], r[0])):
            message = OutboxMessage(
                id=row[0],
                topic=row[1],
                payload=json.loads(row[2]) if isinstance(row[2], str) else row[2],
                dedup_key=row[3],
                attempts=row[4],
                # Read as UTC in SQL: exact for the fence below whatever the
                # session's time zone (USE_TZ = False sets it to TIME_ZONE).
                available_at=clock.utc_from_naive(row[5]),
                created_at=clock.utc_from_naive(row[6]),
                record_id=row[7],
            )
            message._state.adding = False
            message._state.db = using
            claimed.append(_Claimed(message, float(row[9])))
        return claimed
    return _claim_generic(using, limit, lease)


def _claim_generic(using: str, limit: int, lease: float) -> list[_Claimed]:
    """Claim by conditional UPDATEs, one per message (no SKIP LOCKED here)."""
    connection = connections[using]
    moment = clock.app_now()
    until = clock.to_db(moment + dt.timedelta(seconds=lease), connection)
    due = clock.to_db(moment, connection)
    manager = OutboxMessage.objects.using(using)
    candidates = list(
        manager.filter(state=OutboxState.PENDING, available_at__lte=due)
        .order_by("available_at", "id")
        .values_list("id", "attempts")[:limit]
    )
    with transaction.atomic(using=using):  # one commit; the first statement writes
        won = [
            pk
            for pk, attempts in candidates
            if manager.filter(
                pk=pk, state=OutboxState.PENDING, attempts=attempts, available_at__lte=due
            ).update(attempts=attempts + 1, available_at=until)
        ]
    messages = {m.pk: m for m in manager.filter(pk__in=won)}
    return [
        _Claimed(
            messages[pk],
            (moment - clock.from_db(messages[pk].created_at, connection)).total_seconds(),
        )
        for pk in won
    ]


def _fenced(using: str, message: OutboxMessage) -> Any:
    """The message, if it is still pending under the claim this relay made.

    A claim is identified by the lease end it set (``available_at``) and the attempt
    count it reached; a relay that took the message over changed both.
    """
    return OutboxMessage.objects.using(using).filter(
        pk=message.pk,
        state=OutboxState.PENDING,
        attempts=message.attempts,
        available_at=clock.to_db(message.available_at, connections[using]),
    )


def _deliver(using: str, item: _Claimed) -> bool:
    """Call the message's handler; a failure is recorded at once. Returns success."""
    message = item.message
    handler = handlers.get_handler(message.topic)
    try:
        if handler is None:
            raise LookupError(
                f"no outbox handler is registered for topic {message.topic!r}: register "
                "one with @outbox.handler(topic) in a module the relay imports "
                f"(e.g. <app>.{handlers.HANDLER_MODULE})"
            )
        handler(message, message.dedup_key)
    except Exception as exc:
        _fail(using, message, exc)
        return False
    return True


def _mark_sent(using: str, sent: list[_Claimed]) -> None:
    """Mark the batch's delivered messages sent: one UPDATE, fenced by the claim.

    Every message of a batch got the same lease end from the claim, so
    ``available_at`` equal to it means "still this relay's claim".
    """
    if not sent:
        return
    until = clock.to_db(sent[0].message.available_at, connections[using])
    ids = [item.message.pk for item in sent]
    manager = OutboxMessage.objects.using(using)
    updated = manager.filter(pk__in=ids, state=OutboxState.PENDING, available_at=until).update(
        state=OutboxState.SENT, sent_at=now(using)
    )
    mine = set(ids)
    if updated != len(ids):
        mine = set(
            manager.filter(pk__in=ids, state=OutboxState.SENT, available_at=until).values_list(
                "pk", flat=True
            )
        )
        logger.warning(
            "%d outbox message(s) were taken over by another relay while delivered",
            len(ids) - len(mine),
        )
    for item in sent:
        if item.message.pk in mine:
            delivered.send(
                item.message.topic,
                message_id=item.message.pk,
                attempts=item.message.attempts,
                lag=item.age,
            )


def _bury_abandoned(using: str) -> int:
    """Dead-letter due messages that used up their attempts without a verdict.

    ``attempts`` counts deliveries started. A message that is due again after its last
    allowed attempt was claimed never reported back: the relay was killed (a poison
    message that crashes it, a hard time limit) or its handler outlived the lease. It
    would otherwise be retried forever.
    """
    buried = list(
        OutboxMessage.objects.using(using)
        .filter(
            state=OutboxState.PENDING,
            available_at__lte=now(using),
            attempts__gte=conf.outbox_max_attempts,
        )
        .values_list("pk", "topic", "attempts")[:1000]
    )
    for pk, topic, attempts in buried:
        updated = (
            OutboxMessage.objects.using(using)
            .filter(pk=pk, state=OutboxState.PENDING, attempts=attempts)
            .update(
                state=OutboxState.DEAD,
                last_error=(
                    f"attempt {attempts} never reported back: the relay died or the "
                    "handler outlived the relay lease"
                ),
                available_at=now(using),
            )
        )
        if updated:
            logger.error("outbox message %s (%s) dead: attempts used up", pk, topic)
            dead_lettered.send(topic, message_id=pk, attempts=attempts, error=None)
    return len(buried)


def _fail(using: str, message: OutboxMessage, exc: Exception) -> None:
    error = "".join(traceback.format_exception(exc))[-_LAST_ERROR_CHARS:]
    if message.attempts >= conf.outbox_max_attempts:
        updated = _fenced(using, message).update(
            state=OutboxState.DEAD, last_error=error, available_at=now(using)
        )
        if updated:
            logger.error(
                "outbox message %s (%s) dead after %s attempts: %s",
                message.pk,
                message.topic,
                message.attempts,
                exc,
            )
            dead_lettered.send(
                message.topic, message_id=message.pk, attempts=message.attempts, error=exc
            )
        return
    delay = backoff(message.attempts, base=conf.outbox_backoff_base, cap=conf.outbox_backoff_cap)
    if _fenced(using, message).update(last_error=error, available_at=now(using, delay)):
        logger.warning(
            "outbox message %s (%s) failed (attempt %s), retry in %.1f s: %s",
            message.pk,
            message.topic,
            message.attempts,
            delay,
            exc,
        )
        failed.send(
            message.topic,
            message_id=message.pk,
            attempts=message.attempts,
            error=exc,
            retry_in=delay,
        )


def _hand_back(using: str, messages: list[OutboxMessage]) -> None:
    """Return claimed messages no handler saw: due now, the claim's attempt undone."""
    OutboxMessage.objects.using(using).filter(
        pk__in=[m.pk for m in messages],
        state=OutboxState.PENDING,
        # still this claim (see _mark_sent)
        available_at=clock.to_db(messages[0].available_at, connections[using]),
    ).update(attempts=F("attempts") - 1, available_at=now(using))
