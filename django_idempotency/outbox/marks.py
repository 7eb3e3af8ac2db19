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

import logging
import time
from collections.abc import Callable
from typing import Any

from django_idempotency.outbox.lease import Holding
from django_idempotency.store.outbox import Delivered, outbox_store

logger = logging.getLogger("django_idempotency.outbox")


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
        mine = outbox_store(self.using).write_sent(taken)
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
