"""The outbox on SQLite and the other backends: the ORM (docs/outbox.md).

Without ``SKIP LOCKED`` the claim reads the oldest due messages, then claims each with
a conditional ``UPDATE`` (still ``pending``, with the attempt count read, still due):
of two relays that read the same message, one updates it. Abandoned messages are
dead-lettered first, each with its own conditional ``UPDATE``. Marks and renewals are
one conditional ``UPDATE`` per claim in a group.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction

from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.outbox.base import (
    ABANDONED,
    Buried,
    Claimed,
    Delivered,
    OutboxStore,
    claims_of,
)

#: Abandoned messages dead-lettered by one claim, at most.
_BURY_BATCH = 1000


class PortableOutbox(OutboxStore):
    """The outbox's ORM statements; see :class:`OutboxStore` for each method."""

    def now(self, plus_seconds: float = 0.0) -> Any:
        """The application's clock (``store.clock``), as the column stores it."""
        return clock.to_db(clock.app_now() + dt.timedelta(seconds=plus_seconds), self.connection)

    def insert(self, fields: dict[str, Any], available_at: dt.datetime | None) -> OutboxMessage:
        """One insert in a savepoint; on the unique ``(topic, dedup_key)``, a read."""
        now = self.now()
        due = now if available_at is None else clock.to_db(available_at, self.connection)
        manager = OutboxMessage.objects.using(self.using)
        try:
            with transaction.atomic(using=self.using):
                return manager.create(available_at=due, created_at=now, **fields)
        except IntegrityError:
            return manager.get(topic=fields["topic"], dedup_key=fields["dedup_key"])

    def claim_due(
        self, limit: int, lease: float, max_attempts: int
    ) -> tuple[list[Claimed], list[Buried]]:
        """Dead-letter the abandoned, read the due, claim each by a conditional ``UPDATE``."""
        buried = self._bury_abandoned(max_attempts)
        connection = self.connection
        moment = clock.app_now()
        until = clock.to_db(moment + dt.timedelta(seconds=lease), connection)
        due = clock.to_db(moment, connection)
        manager = OutboxMessage.objects.using(self.using)
        candidates = list(
            manager.filter(state=OutboxState.PENDING, available_at__lte=due)
            .order_by("available_at", "id")
            .values_list("id", "attempts")[:limit]
        )
        with transaction.atomic(using=self.using):  # one commit; the first statement writes
            won = [
                pk
                for pk, attempts in candidates
                if manager.filter(
                    pk=pk, state=OutboxState.PENDING, attempts=attempts, available_at__lte=due
                ).update(attempts=attempts + 1, available_at=until)
            ]
        messages = {m.pk: m for m in manager.filter(pk__in=won)}
        claimed = [
            Claimed(
                messages[pk],
                (moment - clock.from_db(messages[pk].created_at, connection)).total_seconds(),
            )
            for pk in won
        ]
        return claimed, buried

    def _bury_abandoned(self, max_attempts: int) -> list[Buried]:
        """Dead-letter due messages that used up their attempts without a verdict.

        ``attempts`` counts deliveries started. A message that is due again after its
        last allowed attempt was claimed never reported back: the relay was killed (a
        poison message that crashes it, a hard time limit) or lost its lease while cut
        off from the database. It would otherwise be retried forever.
        """
        manager = OutboxMessage.objects.using(self.using)
        found = manager.filter(
            state=OutboxState.PENDING,
            available_at__lte=self.now(),
            attempts__gte=max_attempts,
        ).values_list("pk", "topic", "attempts")[:_BURY_BATCH]
        buried = []
        for pk, topic, attempts in list(found):
            updated = manager.filter(pk=pk, state=OutboxState.PENDING, attempts=attempts).update(
                state=OutboxState.DEAD,
                last_error=ABANDONED.format(attempts=attempts),
                available_at=self.now(),
            )
            if updated:
                buried.append(Buried(pk, topic, attempts))
        return buried

    def write_sent(self, sent: Sequence[Delivered]) -> set[int]:
        """One fenced ``UPDATE`` per claim in the group; a read when some did not hold."""
        connection = self.connection
        manager = OutboxMessage.objects.using(self.using)
        sent_at = self.now()
        mine: set[int] = set()
        for (end, attempts), ids in claims_of(item.message for item in sent).items():
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

    def renew(self, held: Sequence[Delivered], lease: float) -> dict[int, dt.datetime]:
        """One fenced ``UPDATE`` per claim, then a read of those it moved."""
        connection = self.connection
        manager = OutboxMessage.objects.using(self.using)
        new_end = clock.app_now() + dt.timedelta(seconds=lease)
        stored_end = clock.to_db(new_end, connection)
        renewed: dict[int, dt.datetime] = {}
        for (end, attempts), ids in claims_of(item.message for item in held).items():
            manager.filter(
                pk__in=ids,
                state=OutboxState.PENDING,
                attempts=attempts,
                available_at__gte=clock.to_db(end, connection),
            ).update(available_at=stored_end)
            mine = manager.filter(pk__in=ids, available_at=stored_end)
            renewed.update(dict.fromkeys(mine.values_list("pk", flat=True), new_end))
        return renewed
