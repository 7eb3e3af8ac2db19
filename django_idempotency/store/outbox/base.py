"""The outbox store's contract (:class:`OutboxStore`) and the values it hands out."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.models import OutboxMessage

#: ``last_error`` of a message whose last allowed attempt never reported back.
ABANDONED = (
    "attempt {attempts} never reported back: the relay died, or lost its lease while cut off "
    "from the database"
)


@dataclass
class Claimed:
    """A message a relay claimed, and its age when claimed (seconds since created).

    ``message.attempts`` and ``message.available_at`` are the claim's (the lease end),
    kept as the fence of every later write about the message.
    """

    message: OutboxMessage
    age: float


class Delivered(Protocol):
    """A claimed message as its claim returned it: all a fenced write needs of it."""

    message: OutboxMessage


class Buried(NamedTuple):
    """A message dead-lettered by a claim: its last allowed attempt never reported back."""

    pk: int
    topic: str
    attempts: int


class OutboxStore:
    """The outbox's statements on one database (``using``: its alias).

    Methods resolve ``connections[using]`` when called, so one store object serves the
    thread that calls it (the relay's or its lease keeper's).
    """

    #: Whether another connection can write while this one's transaction writes: the
    #: relay then tends its lease from a thread of its own (``outbox.lease.Keeper``).
    #: SQLite has one writer at a time.
    concurrent_writers = False

    def __init__(self, using: str) -> None:
        self.using = using

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The calling thread's connection to the database."""
        return connections[self.using]

    def now(self, plus_seconds: float = 0.0) -> Any:
        """Now (+ ``plus_seconds``) by the store's clock, as a value for ORM queries."""
        raise NotImplementedError

    def insert(self, fields: dict[str, Any], available_at: dt.datetime | None) -> OutboxMessage:
        """Write a ``pending`` message, or return the one with its ``(topic, dedup_key)``.

        Args:
            fields: ``topic``, ``payload``, ``dedup_key`` and ``record_id``.
            available_at: aware; not delivered before it (``None``: now).
        """
        raise NotImplementedError

    def claim_due(
        self, limit: int, lease: float, max_attempts: int
    ) -> tuple[list[Claimed], list[Buried]]:
        """Claim at most ``limit`` due messages for ``lease`` seconds, oldest due first.

        A claim counts an attempt. A due message whose ``max_attempts`` are used up is
        not claimed but dead-lettered (:data:`ABANDONED`): its last attempt never
        reported back. No message is claimed by two relays while its lease runs.

        Returns:
            The claimed messages in delivery order, and the messages dead-lettered.

        Raises:
            django.db.DatabaseError: the database failed; nothing was claimed.
        """
        raise NotImplementedError

    def write_sent(self, sent: Sequence[Delivered]) -> set[int]:
        """Mark ``sent`` messages ``sent``, fenced by their claims.

        Args:
            sent: claimed messages whose handler returned, of one or more claims.

        Returns:
            The ids whose claim still held, now ``sent``. The others were taken over by
            a relay that claimed them after their claim's lease ran out.

        Raises:
            django.db.DatabaseError: the database failed; nothing was marked.
        """
        raise NotImplementedError

    def renew(self, held: Sequence[Delivered], lease: float) -> dict[int, dt.datetime]:
        """Move the lease end of ``held`` to ``lease`` seconds from now, fenced by their claim.

        Returns:
            The new lease end (aware, UTC) of each message whose claim still held, by id.

        Raises:
            django.db.DatabaseError: the database failed; nothing was renewed.
        """
        raise NotImplementedError


def claims_of(messages: Iterable[OutboxMessage]) -> dict[tuple[dt.datetime, int], list[int]]:
    """The ids of claimed ``messages`` by claim: (lease end, attempt count), each one's fence."""
    claims: dict[tuple[dt.datetime, int], list[int]] = {}
    for message in messages:
        claims.setdefault((message.available_at, message.attempts), []).append(message.pk)
    return claims
