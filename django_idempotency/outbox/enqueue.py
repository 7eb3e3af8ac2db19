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

from django.db import connections, transaction

from django_idempotency.conf import conf
from django_idempotency.exceptions import NotInTransaction
from django_idempotency.models import OutboxMessage
from django_idempotency.outbox.kick import kick
from django_idempotency.protocol import context
from django_idempotency.store import clock
from django_idempotency.store.outbox import outbox_store
from django_idempotency.store.routing import outbox_database

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
    fields = {"topic": topic, "payload": payload, "dedup_key": dedup_key, "record_id": record_id}
    due = None if available_at is None else clock.aware(available_at)
    message = outbox_store(using).insert(fields, due)
    _schedule_kick(using)
    return message


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
