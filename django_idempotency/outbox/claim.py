"""The relay's first step: claim a batch of due messages (docs/outbox.md).

In one short statement, the oldest due ``pending`` messages are locked with ``SELECT
... FOR UPDATE SKIP LOCKED`` (PostgreSQL), their ``attempts`` incremented and their
``available_at`` moved to the end of the relay lease; the transaction commits at once.
Concurrent relays skip the locked rows and then see them as not due, so no message is
claimed twice while its lease runs. The same statement dead-letters the abandoned
messages it meets (their last allowed attempt never reported back). On SQLite (no SKIP
LOCKED) the claim is a conditional UPDATE per message. Messages claimed but never
handed to a handler are handed back, due at once (:func:`hand_back`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.base import ModelState
from django.db.models.expressions import RawSQL
from django.db.models.signals import post_init, pre_init

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.sql import pg_now

logger = logging.getLogger("django_idempotency.outbox")


_PG_CLAIM_SQL = """
WITH due AS (
    SELECT id, available_at FROM django_idempotency_outbox
    WHERE state = 'pending' AND available_at <= {now}
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE django_idempotency_outbox AS m
    SET attempts = CASE WHEN m.attempts >= %(max)s THEN m.attempts ELSE m.attempts + 1 END,
        available_at = CASE WHEN m.attempts >= %(max)s THEN {now}
                            ELSE {now} + %(lease)s * interval '1 second' END,
        -- abandoned: the last allowed attempt never reported back (see _bury_abandoned)
        state = CASE WHEN m.attempts >= %(max)s THEN 'dead' ELSE m.state END,
        last_error = CASE WHEN m.attempts >= %(max)s
                          THEN 'attempt ' || m.attempts || %(abandoned)s
                          ELSE m.last_error END
    WHERE m.id = ANY(ARRAY(SELECT id FROM due))  -- by primary key, whatever the table's size
    RETURNING m.id, m.topic, m.payload, m.dedup_key, m.attempts,
              m.available_at AT TIME ZONE 'UTC' AS until,
              m.created_at AT TIME ZONE 'UTC' AS created, m.record_id,
              EXTRACT(EPOCH FROM {now} - m.created_at)::float8 AS age, m.state
)
SELECT claimed.id, topic, payload, dedup_key, attempts, until, created, record_id, age, state
FROM claimed JOIN due ON due.id = claimed.id
ORDER BY due.available_at, claimed.id
"""


@dataclass
class Claimed:
    """A message this relay claimed, and its age when claimed (seconds since created)."""

    message: OutboxMessage
    age: float


def now(using: str, plus_seconds: float = 0.0) -> Any:
    """Now (+ ``plus_seconds``) by the store's clock, as a value for ORM queries."""
    if connections[using].vendor == "postgresql":
        sql, params = pg_now()
        return RawSQL(f"({sql} + %s * interval '1 second')", [*params, plus_seconds])
    return clock.to_db(clock.app_now() + dt.timedelta(seconds=plus_seconds), connections[using])


def claim_due(using: str, limit: int, lease: float) -> tuple[list[Claimed], int]:
    """Claim due messages; returns them in delivery order, and how many were buried.

    On PostgreSQL the claim's statement dead-letters the abandoned messages it meets
    (their last allowed attempt never reported back) instead of claiming them;
    elsewhere :func:`_bury_abandoned` runs first.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        buried = _bury_abandoned(using)
        return _claim_generic(using, limit, lease), buried
    now_sql = "(statement_timestamp() + %(offset)s * interval '1 second')"
    params: dict[str, Any] = {
        "offset": clock.offset(),
        "limit": limit,
        "lease": lease,
        "max": conf.outbox_max_attempts,
        "abandoned": _ABANDONED.removeprefix("attempt {attempts}"),
    }
    with connection.cursor() as cursor:
        cursor.execute(_PG_CLAIM_SQL.format(now=now_sql), params)
        rows = cursor.fetchall()
    dead = [row for row in rows if row[9] != OutboxState.PENDING]
    for row in dead:
        _report_buried(row[0], row[1], row[4])
    if dead:
        rows = [row for row in rows if row[9] == OutboxState.PENDING]
    return _messages(rows, using), len(dead)


#: ``last_error`` of a message whose last allowed attempt never reported back.
_ABANDONED = (
    "attempt {attempts} never reported back: the relay died, or lost its lease while cut off "
    "from the database"
)


def _messages(rows: list[tuple[Any, ...]], using: str) -> list[Claimed]:
    """``OutboxMessage`` objects from the claim's rows, as ``Model.from_db`` builds them.

    Built without ``Model.__init__`` (a fifth of the relay's time per message at
    batch 1000) when nobody listens to ``pre_init`` or ``post_init`` for the model:
    the same attributes, set directly. The lease end is the same for the whole batch.
    """
    if pre_init.has_listeners(OutboxMessage) or post_init.has_listeners(OutboxMessage):
        built = []
        for row in rows:
            message = OutboxMessage(
                id=row[0], topic=row[1], payload=_payload(row[2]), dedup_key=row[3],
                attempts=row[4], available_at=clock.utc_from_naive(row[5]),
                created_at=clock.utc_from_naive(row[6]), record_id=row[7],
            )  # fmt: skip
            message._state.adding = False
            message._state.db = using
            built.append(Claimed(message, row[8]))
        return built
    new = object.__new__
    loads = json.loads
    until: dict[Any, dt.datetime] = {}
    claimed = []
    for row in rows:
        state = ModelState()
        state.adding = False
        state.db = using
        message = new(OutboxMessage)
        payload = row[2]
        lease_end = until.get(row[5])
        if lease_end is None:
            # Read as UTC in SQL: exact for the fence whatever the session's time zone
            # (USE_TZ = False sets it to TIME_ZONE).
            lease_end = until[row[5]] = clock.utc_from_naive(row[5])
        message.__dict__.update(
            _state=state,
            id=row[0],
            topic=row[1],
            payload=loads(payload) if isinstance(payload, str) else payload,
            dedup_key=row[3],
            state=OutboxState.PENDING,
            attempts=row[4],
            available_at=lease_end,
            last_error="",
            created_at=clock.utc_from_naive(row[6]),
            sent_at=None,
            record_id=row[7],
        )
        claimed.append(Claimed(message, row[8]))
    return claimed


def _payload(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _claim_generic(using: str, limit: int, lease: float) -> list[Claimed]:
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
        Claimed(
            messages[pk],
            (moment - clock.from_db(messages[pk].created_at, connection)).total_seconds(),
        )
        for pk in won
    ]


def _bury_abandoned(using: str) -> int:
    """Dead-letter due messages that used up their attempts without a verdict.

    ``attempts`` counts deliveries started. A message that is due again after its last
    allowed attempt was claimed never reported back: the relay was killed (a poison
    message that crashes it, a hard time limit) or lost its lease while cut off from the
    database. It
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
                last_error=_ABANDONED.format(attempts=attempts),
                available_at=now(using),
            )
        )
        if updated:
            _report_buried(pk, topic, attempts)
    return len(buried)


def _report_buried(pk: int, topic: str, attempts: int) -> None:
    logger.error("outbox message %s (%s) dead: attempts used up", pk, topic)
    signals.outbox_dead_lettered.send(topic, message_id=pk, attempts=attempts, error=None)


def hand_back(using: str, messages: list[OutboxMessage]) -> None:
    """Return claimed messages no handler saw: due now, the claim's attempt undone.

    Fenced by the claim (its attempt count, and its lease end or a renewal's later
    one): a message another relay claimed after this relay's lease ran out is left
    alone.
    """
    if not messages:
        return
    claims: dict[tuple[dt.datetime, int], list[int]] = {}
    for message in messages:
        claims.setdefault((message.available_at, message.attempts), []).append(message.pk)
    with transaction.atomic(using=using):  # one commit
        for (end, attempts), ids in claims.items():
            OutboxMessage.objects.using(using).filter(
                pk__in=ids,
                state=OutboxState.PENDING,
                # still this claim: its attempt, its lease end or a renewal's later one
                attempts=attempts,
                available_at__gte=clock.to_db(end, connections[using]),
            ).update(attempts=F("attempts") - 1, available_at=now(using))
