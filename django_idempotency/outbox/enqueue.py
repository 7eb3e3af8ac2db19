"""``enqueue``: an effect outside the database, written in the view's own transaction.

A view records an effect outside the database (boot a VM, send an e-mail) as an
:class:`~django_idempotency.models.OutboxMessage` row in its own transaction, so the
message exists if and only if the view's writes committed. The relay
(``outbox.relay``) delivers it after the commit. When the transaction commits, the
relay's Celery task is kicked (``outbox.kick``: queued for a background thread, never
slowing the commit), so delivery need not wait for the next beat. See docs/outbox.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

from django.db import IntegrityError, connections, transaction

from django_idempotency.conf import conf
from django_idempotency.exceptions import NotInTransaction
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox.kick import kick
from django_idempotency.protocol import context
from django_idempotency.store import clock
from django_idempotency.store.routing import outbox_database
from django_idempotency.store.sql import pg_now

logger = logging.getLogger("django_idempotency.outbox")

_MAX = 255


def enqueue(
    topic: str,
    payload: Any,
    *,
    dedup_key: str | None = None,
    using: str | None = None,
    available_at: dt.datetime | None = None,
) -> OutboxMessage:
    """Write a message for the relay, in the current transaction.

    Args:
        topic: selects the handler (``"worker.boot"``); 1 to 255 characters.
        payload: JSON-serialisable data for the handler (``DjangoJSONEncoder``: dates,
            UUIDs and decimals become strings).
        dedup_key: passed to the handler for downstream deduplication; 1 to 255
            characters. Default inside an idempotent view: derived from the request's
            key and record (its generation), the open phase, the topic and the
            message's position (``IdempotencyContext.next_outbox_key``), so a retry of
            the same code derives the same keys. Elsewhere: a random UUID
            (32 hex characters).
        using: database alias; default: inside an idempotent view, its record's
            database (the view's transaction); elsewhere the router's choice for
            ``OutboxMessage``.
        available_at: not delivered before this datetime (default: now); a naive
            one is local time in ``TIME_ZONE``, as everywhere in Django.

    Returns:
        The message. If a message with the same ``(topic, dedup_key)`` exists already,
        nothing is written and that message is returned: enqueueing is idempotent.

    Raises:
        NotInTransaction: no ``atomic()`` block is open on ``using``.
        ValueError: ``topic`` or ``dedup_key`` is empty or too long.
    """
    current = context.current()
    using = using or (current.claim.using if current is not None else outbox_database())
    if not transaction.get_connection(using).in_atomic_block:
        raise NotInTransaction(
            f"outbox.enqueue({topic!r}) was called outside a transaction on database "
            f"{using!r}: the message would be sent even if the work around it failed. "
            "Call it inside transaction.atomic() (idempotent views already run in one)."
        )
    if current is not None and current.claim.using != using:
        current = None  # the record lives elsewhere: no link, no derived key
    if dedup_key is None:
        dedup_key = current.next_outbox_key(topic) if current else uuid.uuid4().hex
    for name, value in (("topic", topic), ("dedup_key", dedup_key)):
        if not isinstance(value, str) or not 0 < len(value) <= _MAX:
            raise ValueError(f"{name} must be a string of 1 to {_MAX} characters, not {value!r}")
    record_id = current.claim.record_id if current else None
    message = _insert(using, topic, payload, dedup_key, record_id, available_at)
    _schedule_kick(using)
    return message


_PG_INSERT_SQL = """
INSERT INTO django_idempotency_outbox (
    topic, payload, dedup_key, state, attempts, available_at, last_error, created_at,
    record_id
)
VALUES (%s, %s, %s, %s, 0, COALESCE(%s, {now}), '', {now}, %s)
ON CONFLICT (topic, dedup_key) DO NOTHING
RETURNING id, available_at, created_at
"""


def _insert(
    using: str,
    topic: str,
    payload: Any,
    dedup_key: str,
    record_id: int | None,
    available_at: dt.datetime | None,
) -> OutboxMessage:
    """One INSERT on PostgreSQL (``ON CONFLICT DO NOTHING``); a savepoint elsewhere."""
    connection = connections[using]
    fields = {"topic": topic, "payload": payload, "dedup_key": dedup_key, "record_id": record_id}
    if available_at is not None:
        available_at = clock.aware(available_at)
    if connection.vendor == "postgresql":
        now_sql, now_params = pg_now()
        json_value = OutboxMessage._meta.get_field("payload").get_db_prep_save(payload, connection)
        params = [topic, json_value, dedup_key, OutboxState.PENDING, available_at]
        params += [*now_params, *now_params, record_id]
        with connection.cursor() as cursor:
            cursor.execute(_PG_INSERT_SQL.format(now=now_sql), params)
            row = cursor.fetchone()
        if row is None:
            return OutboxMessage.objects.using(using).get(topic=topic, dedup_key=dedup_key)
        message = OutboxMessage(id=row[0], available_at=row[1], created_at=row[2], **fields)
        message._state.adding = False
        message._state.db = using
        return message
    now = clock.to_db(clock.app_now(), connection)
    due = now if available_at is None else clock.to_db(available_at, connection)
    try:
        with transaction.atomic(using=using):
            return OutboxMessage.objects.using(using).create(
                available_at=due, created_at=now, **fields
            )
    except IntegrityError:
        return OutboxMessage.objects.using(using).get(topic=topic, dedup_key=dedup_key)


class _Kick:
    """``on_commit`` callback starting the relay task; equal per database alias."""

    def __init__(self, using: str) -> None:
        self.using = using

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Kick) and other.using == self.using

    def __hash__(self) -> int:
        return hash(self.using)

    def __call__(self) -> None:
        kick(self.using)


def _schedule_kick(using: str) -> None:
    """Kick the relay once when the current transaction commits (not once per message)."""
    if not conf.outbox_kick:
        return
    callback = _Kick(using)
    pending = getattr(connections[using], "run_on_commit", ())
    if any(callback == entry[1] for entry in pending if len(entry) > 1):
        return
    transaction.on_commit(callback, using=using)
