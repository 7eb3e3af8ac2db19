"""The relay lease over the messages a relay holds, kept while it works (docs/outbox.md).

A relay's claim leases its batch for ``OUTBOX_RELAY_LEASE`` seconds and counts an
attempt for each message. :class:`Holding` keeps what the relay still holds (every
message claimed and not yet marked, failed or handed back) and:

- **renews** the lease of all of them every third of the lease, in one fenced UPDATE,
  so a handler that runs longer than the lease keeps its message (and its batch's
  delivered messages whose marks wait) from every other relay while this relay lives;
- **hands back** the messages of the batch no handler started once half the lease has
  gone since the claim, or when the relay stops: due at once, the claim's attempt
  undone, so an attempt counts a handler's run, and a message never handed to a
  handler is never dead-lettered.

A handler may block the relay's thread for longer than the lease, so on PostgreSQL
(outside a transaction) a :class:`Keeper` thread, with a database connection of its
own, tends the lease while the relay works; elsewhere the relay's thread tends it
between handlers. Every write about a claimed message (its mark, its failure, its
hand-back, a renewal) is fenced by the claim: the attempt count the claim gave it and a
lease end no earlier than the claim's. A renewal only moves the lease end later, so it
never fences off this relay's own writes; another relay's claim counts an attempt, so
it fences them off.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from django.db import connections

from django_idempotency.outbox.claim import Claimed, hand_back
from django_idempotency.outbox.failures import fail
from django_idempotency.store.outbox import outbox_store
from django_idempotency.store.tenants import enter_schema

logger = logging.getLogger("django_idempotency.outbox")


class Holding:
    """The messages one relay holds under its lease; thread-safe.

    Args:
        using: database alias.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        #: Guards the messages held and the batch's rest (not the database writes).
        self.lock = threading.RLock()
        self._held: dict[int, Claimed] = {}
        self._rest: collections.deque[Claimed] = collections.deque()
        self._lease = math.inf
        self._renew_at = math.inf
        self._hand_back_at = math.inf
        #: Called when new deadlines start (a batch was claimed): the keeper's wake-up.
        self.wake: Callable[[], None] = lambda: None

    def begin(self, claimed: list[Claimed], started: float, lease: float) -> None:
        """Hold a claimed batch; ``started``: ``time.monotonic()`` before the claim."""
        with self.lock:
            first = started + lease / 3
            self._renew_at = min(self._renew_at, first) if self._held else first
            for item in claimed:
                self._held[item.message.pk] = item
            self._rest = collections.deque(claimed)
            self._lease = lease
            self._hand_back_at = started + lease / 2
        self.wake()

    def take(self, stopping: bool) -> Claimed | None:
        """The batch's next message for a handler; ``None`` once none may start.

        None may start once the relay is ``stopping`` or half the lease has gone since
        the claim: the rest is then handed back.

        Raises:
            django.db.DatabaseError: the hand-back failed; the rest stays leased.
        """
        with self.lock:
            if not self._rest:
                return None
            if not stopping and time.monotonic() < self._hand_back_at:
                return self._rest.popleft()
        self._give_back()
        return None

    def time_left(self) -> float | None:
        """Seconds until :meth:`tend` has work (``<= 0``: now); ``None``: none to come."""
        when = min(
            self._renew_at if self._held else math.inf,
            self._hand_back_at if self._rest else math.inf,
        )
        return None if when == math.inf else when - time.monotonic()

    def tend(self) -> None:
        """Hand the batch's rest back at half the lease; renew the lease when due.

        Raises:
            django.db.DatabaseError: the database failed; tried again at the next call.
        """
        now = time.monotonic()
        if self._rest and now >= self._hand_back_at:
            self._give_back()
        if self._held and now >= self._renew_at:
            self._renew()

    def fail(self, item: Claimed, exc: Exception) -> str:
        """Record a failed attempt (``failures.fail``) under the lease; the outcome."""
        outcome = fail(self.using, item.message, exc)
        self.release([item.message.pk])
        return outcome

    def release(self, ids: Iterable[int]) -> None:
        """Stop holding messages whose outcome was written (or taken over), by id."""
        with self.lock:
            for pk in ids:
                self._held.pop(pk, None)

    def give_back_quietly(self, extra: Iterable[Claimed] = ()) -> None:
        """Hand back the batch's rest (and ``extra``) while a batch stops on an error.

        A failure is logged, not raised: the messages stay leased and are delivered
        after the lease.
        """
        with self.lock:
            self._rest.extend(extra)
            count = len(self._rest)
        if not count:
            return
        try:
            self._give_back()
        except Exception as exc:
            logger.warning(
                "%d claimed outbox message(s) not handed back (delivered after the relay "
                "lease): %s",
                count,
                exc,
            )
            with self.lock:
                self.forget(self._rest)
                self._rest.clear()

    def end_batch(self, keep: Iterable[int]) -> None:
        """The batch is over: hold only the ids ``keep`` (delivered, marks not written yet).

        A message whose outcome was not recorded (its handler interrupted, its failure
        not written) is no longer renewed: it is delivered again after its lease.
        """
        kept = set(keep)
        with self.lock:
            self.forget([item for pk, item in self._held.items() if pk not in kept])
            self._rest.clear()

    def forget(self, items: Iterable[Claimed]) -> None:
        """Stop renewing these messages' lease (left as they are in the database)."""
        with self.lock:
            for item in list(items):
                self._held.pop(item.message.pk, None)

    def _give_back(self) -> None:
        """Hand back the batch's rest; on a failure it stays the rest (and leased)."""
        with self.lock:
            rest = list(self._rest)
            self._rest.clear()
        if not rest:
            return
        try:
            hand_back(self.using, [item.message for item in rest])
        except BaseException:
            with self.lock:
                self._rest.extendleft(reversed(rest))
            raise
        self.release(item.message.pk for item in rest)

    def _renew(self) -> None:
        with self.lock:
            items = list(self._held.values())
            lease = self._lease
        renewed = outbox_store(self.using).renew(items, lease)
        with self.lock:
            # Not renewed and still held: another relay's claim has it (this relay's
            # lease had run out). Released meanwhile: marked, failed or handed back.
            lost = [i for i in items if i.message.pk not in renewed and i.message.pk in self._held]
            for item in lost:
                del self._held[item.message.pk]
            if lost:
                self._rest = collections.deque(i for i in self._rest if i.message.pk in self._held)
            self._renew_at = time.monotonic() + lease / 3
        if lost:
            logger.warning(
                "%d outbox message(s) were taken over by another relay while held", len(lost)
            )


#: Seconds the keeper waits before it tries a failed write again; doubled after each
#: further failure, up to ``_RETRY_CAP``.
_RETRY_AFTER = 0.1
_RETRY_CAP = 2.0


class Keeper:
    """A thread that tends a :class:`Holding` while the relay's thread runs handlers.

    It renews the lease and hands the batch's rest back at their deadlines, even while a
    handler blocks the relay's thread, on a connection of its own (in ``schema``, a
    django-tenants schema, if given), and closes its connections when it stops. It
    outlives failures: after an error (the database down, its connection terminated)
    it closes its connection and tries again after a pause doubling from
    ``_RETRY_AFTER`` up to ``_RETRY_CAP`` seconds; the first failure of a run of them
    is logged as a warning, the recovery as info.
    """

    def __init__(self, holding: Holding, schema: str | None = None) -> None:
        self.holding = holding
        self.schema = schema
        self._woken = threading.Event()
        self._stopped = False
        holding.wake = self._woken.set
        self._thread = threading.Thread(target=self._run, name="outbox-lease-keeper", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and wait for it (a write it is making finishes first)."""
        self._stopped = True
        self._woken.set()
        self._thread.join()

    def _run(self) -> None:
        using = self.holding.using
        failures = 0
        try:
            enter_schema(using, self.schema)
            while True:
                self._woken.clear()
                if self._stopped:
                    return
                left = self.holding.time_left()
                if left is None or left > 0:
                    self._woken.wait(left)
                    continue
                try:
                    self.holding.tend()
                except Exception as exc:
                    failures += 1
                    with contextlib.suppress(Exception):
                        connections[using].close()  # the next try connects afresh
                    log = logger.warning if failures == 1 else logger.debug
                    log("outbox relay lease not renewed yet, will retry: %s", exc)
                    if not self._stopped:
                        self._woken.wait(min(_RETRY_CAP, _RETRY_AFTER * 2.0 ** (failures - 1)))
                    continue
                if failures:
                    logger.info("outbox relay lease renewed again after %d failed tries", failures)
                    failures = 0
        finally:
            connections.close_all()
