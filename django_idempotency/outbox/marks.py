"""The relay's marks: delivered messages marked ``sent`` in groups (docs/outbox.md).

A delivered message is not marked on its own: :class:`Marks` keeps it in the current
*group*, and the relay writes the whole group in one fenced UPDATE, on its own thread
and connection, once the group's oldest mark is ``max_age`` seconds old
(``OUTBOX_MARK_DELAY``) and a handler has finished (or, with a pool, at that deadline),
and at the end of the batch. A group therefore waits at most ``max_age`` plus the time
of the handler that runs meanwhile; a relay killed while a group waits delivers those
messages again after the lease (at least once). If the database refuses a group, it
stays pending and is written by the relay's next batch or :meth:`Relay.close` while its
lease holds, else its messages are delivered again after it.

Every write is fenced by the claim: the message must still be ``pending`` with the
attempt count this relay's claim gave it and a lease end (``available_at``) no earlier
than the claim's (the relay renews its lease, ``outbox.lease``). Messages a relay with
a later claim took over (its claim counted an attempt) are left alone, and logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from django.db import connections

from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox.lease import Holding
from django_idempotency.store import clock

logger = logging.getLogger("django_idempotency.outbox")

_PG_MARK_SQL = """
UPDATE django_idempotency_outbox AS m
SET state = 'sent', sent_at = {now}
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(until)s::timestamptz[])
     AS c(id, attempts, until)
WHERE m.id = c.id AND m.attempts = c.attempts AND m.available_at >= c.until
  AND m.state = 'pending'
  AND m.id = ANY(%(ids)s::bigint[])  -- by primary key, whatever the table's size
RETURNING m.id
"""
_NOW = "(statement_timestamp() + %(offset)s * interval '1 second')"


class Delivered(Protocol):
    """A delivered message, as its claim returned it: all a mark needs of it."""

    message: OutboxMessage


def write_sent(using: str, sent: Sequence[Delivered]) -> set[int]:
    """Mark ``sent`` messages ``sent`` in one UPDATE, fenced by their claims.

    Args:
        using: database alias.
        sent: claimed messages whose handler returned, of one or more claims.

    Returns:
        The ids whose claim still held, now ``sent``. The others were taken over by a
        relay that claimed them after their claim's lease ran out.

    Raises:
        django.db.DatabaseError: the database failed; nothing was marked.
    """
    if not sent:
        return set()
    connection = connections[using]
    if connection.vendor == "postgresql":
        # ISO strings with their offset: the exact instant whatever the session's
        # time zone (USE_TZ = False sets it to TIME_ZONE). One per claim.
        iso: dict[dt.datetime, str] = {}
        until = []
        for item in sent:
            end = item.message.available_at
            text = iso.get(end)
            if text is None:
                text = iso[end] = end.astimezone(dt.UTC).isoformat()
            until.append(text)
        params: dict[str, Any] = {
            "offset": clock.offset(),
            "ids": [item.message.pk for item in sent],
            "attempts": [item.message.attempts for item in sent],
            "until": until,
        }
        with connection.cursor() as cursor:
            cursor.execute(_PG_MARK_SQL.format(now=_NOW), params)
            return {row[0] for row in cursor.fetchall()}
    manager = OutboxMessage.objects.using(using)
    sent_at = clock.to_db(clock.app_now(), connection)
    claims: dict[tuple[dt.datetime, int], list[int]] = {}
    for item in sent:
        claim = (item.message.available_at, item.message.attempts)
        claims.setdefault(claim, []).append(item.message.pk)
    mine: set[int] = set()
    for (end, attempts), ids in claims.items():
        fence = {
            "state": OutboxState.PENDING,
            "attempts": attempts,
            "available_at__gte": clock.to_db(end, connection),
        }
        updated = manager.filter(pk__in=ids, **fence).update(
            state=OutboxState.SENT, sent_at=sent_at
        )
        if updated == len(ids):
            mine.update(ids)
        else:
            fence["state"] = OutboxState.SENT
            mine.update(manager.filter(pk__in=ids, **fence).values_list("pk", flat=True))
    return mine


class Marks:
    """The delivered messages of one relay that are not marked ``sent`` yet.

    Used by the relay's thread alone. A written mark ends the message's hold on the
    relay's lease (``outbox.lease``).

    Args:
        using: database alias.
        holding: the relay's lease over its messages.
        on_sent: called with each claimed message once its mark is committed.
    """

    def __init__(self, using: str, holding: Holding, on_sent: Callable[[Any], None]) -> None:
        self.using = using
        self.holding = holding
        self._on_sent = on_sent
        self._pending: list[Delivered] = []
        self._oldest = 0.0
        #: Seconds a mark may wait in its group; ``0``: each one written when added.
        self.max_age = 0.0

    @property
    def pending(self) -> int:
        """Marks waiting to be written."""
        return len(self._pending)

    def ids(self) -> list[int]:
        """The ids of the messages whose marks wait to be written."""
        return [item.message.pk for item in self._pending]

    def add(self, item: Delivered) -> None:
        """Add the mark of a message whose handler returned."""
        if not self._pending:
            self._oldest = time.monotonic()
        self._pending.append(item)

    def time_left(self) -> float | None:
        """Seconds until the group is due (``<= 0``: due); ``None``: no marks pending."""
        if not self._pending:
            return None
        return self._oldest + self.max_age - time.monotonic()

    def due(self) -> bool:
        """Whether the group's oldest mark is ``max_age`` old: write it now."""
        left = self.time_left()
        return left is not None and left <= 0

    def flush(self) -> None:
        """Write every pending mark now, in one fenced UPDATE (one per claim on SQLite).

        Raises:
            django.db.DatabaseError: the database failed; the marks stay pending.
        """
        taken = self._pending
        if not taken:
            return
        mine = write_sent(self.using, taken)
        self._pending = []
        self.holding.release(item.message.pk for item in taken)
        if len(mine) != len(taken):
            logger.warning(
                "%d outbox message(s) were taken over by another relay while delivered",
                len(taken) - len(mine),
            )
        for item in taken:
            if item.message.pk in mine:
                self._on_sent(item)
