"""The outbox's store: what the relay and ``enqueue`` ask of a database (docs/outbox.md).

One small contract, :class:`OutboxStore`, with one implementation per store kind, as
Django's session backends have: ``postgresql`` (one statement per step, rows locked
with ``SKIP LOCKED``) and ``portable`` (the ORM, one conditional ``UPDATE`` per message
or per claim: SQLite and the other backends). :func:`outbox_store` picks the one of a
database. What to do with the answers (report a dead letter, hold a lease, group the
marks) is the outbox's (``django_idempotency.outbox``).

Every write about a claimed message is fenced by its claim: the message must still be
``pending`` with the attempt count the claim gave it and a lease end (``available_at``)
no earlier than the claim's (a renewal only moves it later).
"""

from __future__ import annotations

from django.db import connections

from django_idempotency.store.outbox.base import (
    ABANDONED,
    Buried,
    Claimed,
    Delivered,
    OutboxStore,
    claims_of,
)
from django_idempotency.store.outbox.portable import PortableOutbox
from django_idempotency.store.outbox.postgresql import PostgresOutbox

__all__ = [
    "ABANDONED",
    "Buried",
    "Claimed",
    "Delivered",
    "OutboxStore",
    "PortableOutbox",
    "PostgresOutbox",
    "claims_of",
    "outbox_store",
]


def outbox_store(using: str) -> OutboxStore:
    """The outbox store of database ``using`` (an alias): PostgreSQL's, or the portable one."""
    if connections[using].vendor == "postgresql":
        return PostgresOutbox(using)
    return PortableOutbox(using)
