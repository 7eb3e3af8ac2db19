"""The outbox relay: claim due messages, call their handlers, mark them (docs/outbox.md).

:func:`deliver_batch` is one pass; :class:`Relay` runs many. Each pass has three steps:

1. **claim** (``outbox.claim``): the oldest due messages, leased to this relay;
2. **deliver** (``outbox.deliver``): their handlers, one by one on this thread or in a
   thread pool, the lease kept meanwhile (``outbox.lease``);
3. **mark**: a failure at once (``outbox.failures``), the delivered messages ``sent``
   in groups no older than ``OUTBOX_MARK_DELAY`` when a handler finishes, and at the
   end of the batch (``outbox.marks``).

A relay stopped by an exception (or :meth:`Relay.stop`) between 1 and 3 lets its
running handlers finish, marks what they delivered and hands back what no handler
started. A relay killed between 1 and 3 leaves its messages ``pending`` with
``available_at`` at the lease's end: they are delivered again after it, including
those whose mark was still waiting in its group. Delivery is therefore at least once;
the dedup key makes it effectively once downstream. Smaller batches shrink what a
crash redelivers; larger ones cost fewer statements per message (benchmarks/relay.py).
On SQLite concurrent relays stay correct but serialise on the database's single
writer, so run one relay; marks are written one by one there. Clock: the store's
(``django_idempotency.store.clock``).
"""

from __future__ import annotations

import collections
import logging
import time

from django.db import connections

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.outbox import handlers
from django_idempotency.outbox.claim import Claimed, claim_due
from django_idempotency.outbox.deliver import Pool, call, discard_broken_connections
from django_idempotency.outbox.lease import Holding, Keeper
from django_idempotency.outbox.marks import Marks
from django_idempotency.store.outbox import outbox_store
from django_idempotency.store.routing import outbox_database
from django_idempotency.store.tenants import current_schema, use_schema

logger = logging.getLogger("django_idempotency.outbox")


def deliver_batch(
    batch_size: int | None = None,
    *,
    using: str | None = None,
    lease: float | None = None,
    threads: int | None = None,
) -> int:
    """Claim up to ``batch_size`` due messages and deliver them; one relay pass.

    Handlers start in ``(available_at, id)`` order within the batch. No order holds
    across batches, relays or retries (a failed message is retried later, after newer
    ones); with ``threads`` above 1, handlers of one batch overlap and may finish in
    any order. On PostgreSQL, delivered messages are marked sent in groups, written
    once the group is ``OUTBOX_MARK_DELAY`` old and a handler has finished
    (``outbox.marks``); elsewhere each one before the next handler starts. All are
    written when this returns. The relay renews the lease of the messages it holds every
    third of the lease (``outbox.lease``), so a handler slower than the lease is not run
    again by another relay. Once half the lease has gone since the claim, the relay
    stops starting handlers and hands the rest of the batch back (due at once, the
    claim's attempt undone), even while a handler runs. Due messages whose last allowed
    attempt never reported back (the relay died, or lost its lease while cut off from
    the database) are dead-lettered.

    Args:
        batch_size: most messages claimed (default ``OUTBOX_BATCH_SIZE``).
        using: database alias (default: the router's choice for ``OutboxMessage``).
        lease: seconds the claimed messages are held (default ``OUTBOX_RELAY_LEASE``).
        threads: handlers run at the same time, each in a pool thread with its own
            database connections (default ``OUTBOX_RELAY_THREADS``; 1: one after the
            other on the calling thread). Inside a transaction (``atomic``), which
            other connections cannot see into, handlers always run one by one.

    Returns:
        Messages handled: sent, retried or dead-lettered. 0: nothing was due.

    Raises:
        ValueError: ``batch_size`` or ``threads`` below 1.
        django.db.DatabaseError: the database failed; claimed messages stay leased
            and are delivered after the lease.
    """
    with Relay(using, lease=lease, threads=threads) as relay:
        return relay.deliver_batch(batch_size)


class Relay:
    """One relay delivering batch after batch from one database (docs/outbox.md).

    What :func:`deliver_batch` does once, for many batches, keeping its lease keeper
    and its handlers' pool from one batch to the next; :meth:`close` (or leaving the
    ``with`` block) stops them and writes the marks a failed batch left pending.

    However a batch ends, what its handlers delivered is marked: when an exception
    stops it (a handler raising ``SystemExit``, ``KeyboardInterrupt``, a Celery soft
    time limit, the database failing), the handlers running finish, the messages they
    delivered are marked and their failures recorded, and the messages no handler
    started are handed back (due at once); then the exception propagates. The
    message whose handler the exception interrupted stays leased and is delivered
    again after the lease. :meth:`stop` ends the batch the same way without an
    exception.

    Args:
        using: database alias (default: the router's choice for ``OutboxMessage``).
        lease: seconds the claimed messages are held (default ``OUTBOX_RELAY_LEASE``).
        threads: handlers run at the same time (default ``OUTBOX_RELAY_THREADS``).
        schema: on a schema-per-tenant database (django-tenants), the schema whose
            outbox this relay delivers (``store.tenants.schemas`` lists them): its
            batches, its handlers' threads and its lease keeper run in it
            (docs/tenants.md). ``None``: the schema the calling thread's connection
            runs in when the relay is made.
        stop_on: exception types that stop the batch when a handler raises one (a
            time limit raised inside the handler, such as Celery's
            ``SoftTimeLimitExceeded``): the attempt is recorded as failed (retried
            after its backoff), the batch stops as above and the exception
            propagates. Any other ``Exception`` of a handler is that message's
            failure alone.

    Raises:
        ValueError: ``threads`` below 1.
    """

    def __init__(
        self,
        using: str | None = None,
        *,
        lease: float | None = None,
        threads: int | None = None,
        stop_on: tuple[type[BaseException], ...] = (),
        schema: str | None = None,
    ) -> None:
        handlers.autodiscover()
        self.using = using or outbox_database()
        # None: the schema the caller's connection runs in now (django-tenants), so the
        # handlers' threads and the lease keeper, whose connections start in public,
        # work where the batches are claimed.
        self.schema = schema if schema is not None else current_schema(connections[self.using])
        self.lease = lease
        self.threads = threads
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.stop_on = tuple(stop_on)
        self._holding = Holding(self.using)
        self._marks = Marks(self.using, self._holding, _report_sent)
        self._keeper: Keeper | None = None
        self._pool: Pool | None = None
        self._stopping = False
        #: Messages this relay handled so far (sent, retried or dead-lettered), those
        #: of a batch an exception stopped included.
        self.handled = 0
        #: The same by outcome: ``delivered`` (its handler returned: marked sent),
        #: ``failed`` (retried later), ``dead`` (dead-lettered, after its handler
        #: raised or because its last attempt never reported back), ``taken over``
        #: (a failure not recorded: another relay's claim had the message).
        self.outcomes: collections.Counter[str] = collections.Counter()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called: no handler starts any more."""
        return self._stopping

    @property
    def unmarked(self) -> int:
        """Delivered messages whose mark is not written yet.

        Not 0 after a database failure, until a later batch or :meth:`close` writes them.
        """
        return self._marks.pending

    def stop(self) -> None:
        """Stop gracefully: start no further handler, in this batch or a later one.

        The handlers running finish and what they delivered is marked; the rest of the
        batch is handed back, due at once for any relay; :meth:`deliver_batch` then
        returns, and returns 0 without claiming from then on. Safe to call from a
        signal handler (the management command's ``SIGTERM``) or another thread.
        """
        self._stopping = True
        pool = self._pool
        if pool is not None:
            pool.wake()  # the relay's thread may be waiting for a handler's outcome

    def close(self) -> None:
        """Stop the pool and the lease keeper; write the marks still pending.

        Raises:
            django.db.DatabaseError: the database failed; the messages not marked stay
                leased: a later :meth:`close` or batch of this relay writes their marks
                while their lease holds, else they are delivered again after it.
        """
        with use_schema(self.using, self.schema):
            try:
                if self._pool is not None:
                    pool, self._pool = self._pool, None
                    pool.close()
            finally:
                if self._keeper is not None:
                    keeper, self._keeper = self._keeper, None
                    keeper.close()
                try:
                    self._marks.flush()
                finally:
                    self._holding.end_batch(self._marks.ids())

    def deliver_batch(self, batch_size: int | None = None) -> int:
        """One batch, as :func:`deliver_batch`.

        Returns:
            Messages handled; 0 once :meth:`stop` was called.

        Raises:
            ValueError: ``batch_size`` below 1.
            django.db.DatabaseError: the database failed.
        """
        with use_schema(self.using, self.schema):
            return self._batch(batch_size)

    def _batch(self, batch_size: int | None) -> int:
        using = self.using
        limit = conf.outbox_batch_size if batch_size is None else int(batch_size)
        lease = conf.outbox_relay_lease if self.lease is None else float(self.lease)
        workers = conf.outbox_relay_threads if self.threads is None else int(self.threads)
        if limit < 1:
            raise ValueError(f"batch_size must be at least 1, not {limit}")
        if self._stopping:
            return 0
        started = time.monotonic()
        claimed, buried = claim_due(using, limit, lease)
        self.handled += buried
        self.outcomes["dead"] += buried
        if not claimed:
            return buried
        # Inside a transaction no other connection sees the claim: no keeper, no pool.
        # A database with one writer at a time (SQLite): no keeper either. Then each
        # mark is written when its handler returns, and the lease tended between handlers.
        inside = connections[using].in_atomic_block
        alone = inside or not outbox_store(using).concurrent_writers
        self._marks.max_age = 0.0 if alone else conf.outbox_mark_delay
        self._holding.begin(claimed, started, lease)
        if not alone and self._keeper is None:
            self._keeper = Keeper(self._holding, self.schema)
        try:
            if workers == 1 or inside or len(claimed) == 1:
                handled = self._deliver_inline()
            else:
                if self._pool is not None and self._pool.size != workers:
                    self._pool.close()
                    self._pool = None
                if self._pool is None:  # kept for the next batches: threads, connections
                    self._pool = Pool(workers, using, self.schema)
                handled = self._deliver_pooled(self._pool)
            self._marks.flush()
        except BaseException:
            self._holding.end_batch(self._marks.ids())
            # What was delivered is in the marks (the pool's running handlers have
            # finished); written now if the database lets us. The error that stopped
            # the batch is the one raised.
            try:
                self.close()
            except Exception as exc:
                logger.warning(
                    "%d delivered outbox message(s) not marked sent yet after a failed "
                    "batch (written by this relay's next batch or close() while their "
                    "lease holds, else delivered again after it): %s",
                    self._marks.pending,
                    exc,
                )
            raise
        self._holding.end_batch(self._marks.ids())
        return buried + handled

    def _deliver_inline(self) -> int:
        """Run the handlers one by one on this thread; marks written when due.

        The holding gives the next message, or none once half the lease has gone or the
        relay stops (the rest handed back).
        """
        holding, marks = self._holding, self._marks
        handled = 0
        try:
            while True:
                holding.tend()  # between handlers; the keeper while one blocks
                item = holding.take(self._stopping)
                if item is None:
                    return handled
                error = call(item.message)
                if error is not None or connections[self.using].errors_occurred:
                    discard_broken_connections()
                handled += 1
                self._record(item, error)
                if isinstance(error, self.stop_on):
                    raise error
                if marks.due():
                    marks.flush()
        except BaseException:
            holding.give_back_quietly()
            raise

    def _deliver_pooled(self, pool: Pool) -> int:
        """Run the handlers on the pool's threads; marks and failures written here.

        Marks are written on this thread when a group is due, after a handler's outcome
        or at the group's deadline. If anything stops the batch, the pool is closed: its
        running handlers finish and their outcomes are recorded, what no thread started
        is handed back.
        """
        holding, marks = self._holding, self._marks
        handled = running = 0
        more = True  # the batch may still give a message to start
        try:
            while more or running:
                if more and running < pool.size:
                    item = holding.take(self._stopping)
                    if item is None:
                        more = False
                        continue
                    running += 1
                    pool.submit(item)
                    continue
                left = _earliest(marks.time_left(), holding.time_left())
                outcome = pool.result(None if left is None else max(left, 0.0))
                if outcome is None:  # a deadline came first, or stop() woke us
                    holding.tend()
                    if self._stopping:
                        more = more and holding.take(True) is not None
                else:
                    item, error = outcome
                    running -= 1
                    handled += 1
                    self._record(item, error)
                    if error is not None and (
                        isinstance(error, self.stop_on) or not isinstance(error, Exception)
                    ):  # SystemExit, KeyboardInterrupt in a handler: stop as inline would
                        raise error
                if marks.due():
                    marks.flush()
        except BaseException:
            self._pool = None
            holding.give_back_quietly(pool.cancel())
            _not_started, outcomes = pool.close()  # the running handlers finish first
            for item, error in outcomes:
                try:
                    self._record(item, error)
                except Exception as exc:
                    logger.warning(
                        "outbox message %s: outcome not recorded: %s", item.message.pk, exc
                    )
            raise
        return handled

    def _record(self, item: Claimed, error: BaseException | None) -> None:
        """Count a handler's outcome: its mark added, or its failure written.

        A handler stopped by a ``BaseException`` that is not an ``Exception`` reported
        nothing: its message stays leased.
        """
        if error is None:
            self.handled += 1
            self._marks.add(item)
            self.outcomes["delivered"] += 1
        elif isinstance(error, Exception):
            self.handled += 1
            self.outcomes[self._holding.fail(item, error) or "taken over"] += 1


def deliver_due(
    batch_size: int | None = None,
    *,
    using: str | None = None,
    max_batches: int = 10,
    threads: int | None = None,
    stop_on: tuple[type[BaseException], ...] = (),
    schema: str | None = None,
) -> int:
    """Run :func:`deliver_batch` until a batch comes back short, at most ``max_batches``.

    Args:
        batch_size: most messages claimed per batch (default ``OUTBOX_BATCH_SIZE``).
        using: database alias (default: the router's choice for ``OutboxMessage``).
        max_batches: batches at most.
        threads: handlers run at the same time (default ``OUTBOX_RELAY_THREADS``).
        stop_on: exception types of handlers that stop the run (:class:`Relay`).
        schema: the tenant schema whose outbox to deliver (:class:`Relay`).

    Returns:
        Messages handled in all batches.

    Raises:
        django.db.DatabaseError: the database failed; what was delivered is marked if
            the database lets it, the rest stays leased (:class:`Relay`).
    """
    limit = conf.outbox_batch_size if batch_size is None else int(batch_size)
    total = 0
    with Relay(using, threads=threads, stop_on=stop_on, schema=schema) as relay:
        for _ in range(max_batches):
            handled = relay.deliver_batch(limit)
            total += handled
            if handled < limit:
                break
    return total


def _earliest(*lefts: float | None) -> float | None:
    """The smallest of the seconds given; ``None`` if none is."""
    known = [left for left in lefts if left is not None]
    return min(known) if known else None


def _report_sent(item: Claimed) -> None:
    """The ``delivered`` signal of a message whose mark was committed."""
    signals.outbox_delivered.send(
        item.message.topic, message_id=item.message.pk, attempts=item.message.attempts, lag=item.age
    )
