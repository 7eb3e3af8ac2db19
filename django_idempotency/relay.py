"""The outbox relay: claim due messages, call their handlers, mark them (docs/outbox.md).

:func:`deliver_batch` is one pass (:class:`Relay` runs many, writing a batch's last
marks while it claims the next):

1. **Claim**, in one short statement: the oldest due ``pending`` messages are locked
   with ``SELECT ... FOR UPDATE SKIP LOCKED`` (PostgreSQL), their ``attempts`` is
   incremented and their ``available_at`` moved to the end of the relay lease. The
   transaction commits at once; concurrent relays skip the locked rows and then see
   them as not due, so no message is claimed twice while its lease runs. The same
   statement dead-letters the abandoned messages it meets (last attempt used up).
2. **Deliver**, outside any transaction the relay holds: each handler is called with
   the message and its dedup key, one by one or in a bounded thread pool
   (``threads``).
3. **Mark**, fenced by the claim (its lease end and attempt count, so a relay whose
   lease ran out cannot overwrite the relay that took the message over): a failure at
   once, with a retry ``available_at`` from exponential backoff with full jitter, or
   ``dead`` after ``OUTBOX_MAX_ATTEMPTS`` attempts; the delivered messages ``sent`` in
   groups no older than ``OUTBOX_MARK_DELAY``, one UPDATE per group, written by a
   watchdog thread if a handler blocks meanwhile (``django_idempotency.marks``).

A relay stopped by an exception (or :meth:`Relay.stop`) between 1 and 3 lets its
running handlers finish, marks what they delivered and hands back what no handler
started. A relay killed between 1 and 3 leaves its messages ``pending`` with
``available_at`` at the lease's end: they are delivered again after it, including
those whose mark was still waiting in its group. Delivery is therefore at least once;
the dedup key makes it effectively once downstream. Smaller batches shrink what a
crash redelivers; larger ones cost fewer statements per message (benchmarks/relay.py).
On SQLite (no SKIP LOCKED) the claim is a conditional UPDATE per message: concurrent
relays stay correct but serialise on the database's single writer, so run one relay;
marks are written one by one there. Clock: the store's (``django_idempotency.clock``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import queue
import random
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.base import ModelState
from django.db.models.expressions import RawSQL
from django.db.models.signals import post_init, pre_init
from django.dispatch import Signal

from django_idempotency import handlers
from django_idempotency.conf import conf
from django_idempotency.marks import Marks
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.sql import pg_now

logger = logging.getLogger("django_idempotency.outbox")

#: Sent with ``sender`` = the topic and ``message_id``, ``attempts`` and ``lag``
#: (seconds from ``created_at`` to now), for the delivery-lag metric
#: (docs/observability.md).
delivered = Signal()
#: A delivery failed and will be retried: ``message_id``, ``attempts``, ``error``,
#: ``retry_in`` (seconds).
failed = Signal()
#: A delivery failed for the last time; the message is ``dead``: ``message_id``,
#: ``attempts``, ``error``.
dead_lettered = Signal()

_LAST_ERROR_CHARS = 4000

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


def backoff(
    attempts: int,
    *,
    base: float,
    cap: float,
    rand: Any = random.random,
) -> float:
    """Seconds to wait before the next attempt: exponential growth, full jitter.

    A uniformly random delay between 0 and ``min(cap, base * 2 ** (attempts - 1))``
    ("full jitter"), so retries of many failed messages spread out instead of
    arriving together.

    Args:
        attempts: attempts made so far (1 after the first failure).
        base: upper bound after the first failure, in seconds.
        cap: largest upper bound, in seconds.
        rand: ``() -> float`` in ``[0, 1)``; injectable for tests.
    """
    ceiling = min(cap, base * 2.0 ** max(attempts - 1, 0))
    return float(rand()) * ceiling


@dataclass
class _Claimed:
    message: OutboxMessage
    age: float


def now(using: str, plus_seconds: float = 0.0) -> Any:
    """Now (+ ``plus_seconds``) by the store's clock, as a value for ORM queries."""
    if connections[using].vendor == "postgresql":
        sql, params = pg_now()
        return RawSQL(f"({sql} + %s * interval '1 second')", [*params, plus_seconds])
    return clock.to_db(clock.app_now() + dt.timedelta(seconds=plus_seconds), connections[using])


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
    any order. On PostgreSQL, delivered messages are marked sent in groups no older
    than ``OUTBOX_MARK_DELAY``, a watchdog writing a group whose deadline passes
    while a handler blocks (``django_idempotency.marks``); elsewhere each one before
    the next handler starts. All are written when this returns. Once half the lease
    has gone, the relay stops starting handlers and hands the rest of the batch back
    (due at once), so a long batch never outlives its lease. Due messages whose last
    allowed attempt never reported back (the relay died, or the handler outlived the
    lease) are dead-lettered.

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
        return relay._batch(batch_size, hand_off=False)  # close() writes the marks


class Relay:
    """One relay delivering batch after batch from one database (docs/outbox.md).

    What :func:`deliver_batch` does once, for many batches: between batches the
    marks of the last one are written by the marks' writer thread, on its own
    connection, while this thread claims the next batch. :meth:`close` (or leaving
    the ``with`` block) waits until every mark is written.

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
    ) -> None:
        handlers.autodiscover()
        self.using = using or handlers.database_for_write()
        self.lease = lease
        self.threads = threads
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.stop_on = tuple(stop_on)
        self._marks = Marks(self.using, conf.outbox_mark_delay, _report_sent)
        self._pool: _Pool | None = None
        self._stopping = False
        #: Messages this relay handled so far (sent, retried or dead-lettered), those
        #: of a batch an exception stopped included.
        self.handled = 0

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
        """Write the marks still pending and stop the marks' writer.

        Raises:
            django.db.DatabaseError: the database failed; the messages not marked stay
                leased: a later :meth:`close` or batch of this relay writes their marks
                while their lease holds, else they are delivered again after it.
        """
        try:
            if self._pool is not None:
                pool, self._pool = self._pool, None
                pool.close()
        finally:
            self._marks.close()

    def deliver_batch(self, batch_size: int | None = None) -> int:
        """One batch, as :func:`deliver_batch`; its marks may still be written after.

        Returns:
            Messages handled; 0 once :meth:`stop` was called.

        Raises:
            ValueError: ``batch_size`` below 1.
            django.db.DatabaseError: the database failed.
        """
        return self._batch(batch_size, hand_off=True)

    def _batch(self, batch_size: int | None, *, hand_off: bool) -> int:
        using = self.using
        limit = conf.outbox_batch_size if batch_size is None else int(batch_size)
        lease = conf.outbox_relay_lease if self.lease is None else float(self.lease)
        workers = conf.outbox_relay_threads if self.threads is None else int(self.threads)
        if limit < 1:
            raise ValueError(f"batch_size must be at least 1, not {limit}")
        if self._stopping:
            return 0
        started = time.monotonic()
        claimed, buried = _claim(using, limit, lease)
        self.handled += buried
        if not claimed:
            return buried
        marks = self._marks
        # Inside a transaction no other connection sees the claim: no writer thread,
        # no pool. SQLite has one writer: no writer thread either. Then each mark is
        # written before the next handler starts.
        inside = connections[using].in_atomic_block
        marks.sync = inside or connections[using].vendor != "postgresql"
        marks.max_age = conf.outbox_mark_delay
        try:
            if workers == 1 or inside or len(claimed) == 1:
                handled = _deliver_inline(self, claimed, started, lease)
            else:
                if self._pool is not None and self._pool.size != workers:
                    self._pool.close()
                    self._pool = None
                if self._pool is None:  # kept for the next batches: threads, connections
                    self._pool = _Pool(workers)
                handled = _deliver_pooled(self, claimed, started, lease, self._pool)
        except BaseException:
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
        if hand_off:
            marks.hand_off()  # written now, by the writer, while the next batch is claimed
        return buried + handled


def _deliver_inline(relay: Relay, claimed: list[_Claimed], started: float, lease: float) -> int:
    """Run the handlers one by one on this thread."""
    using, marks = relay.using, relay._marks
    handled = 0
    begun = 0  # claimed[begun:] were never handed to a handler
    try:
        for item in claimed:
            if relay.stopping or time.monotonic() - started > lease / 2:
                marks.flush()
                _hand_back(using, [c.message for c in claimed[handled:]])
                begun = len(claimed)
                break
            marks.before_handler()  # written now if due, else by its deadline
            begun = handled + 1
            error = _call(item.message)
            if error is not None or connections[using].errors_occurred:
                _discard_broken_connections()
            handled += 1
            relay.handled += 1
            if error is None:
                marks.add(item)
            else:
                _fail(using, item.message, error)
                if isinstance(error, relay.stop_on):
                    raise error
    except BaseException:
        _hand_back_quietly(using, claimed[begun:])
        raise
    return handled


def _deliver_pooled(
    relay: Relay,
    claimed: list[_Claimed],
    started: float,
    lease: float,
    pool: _Pool,
) -> int:
    """Run the handlers on the pool's threads.

    Marks and failures are written here, on the relay's thread and connection, a
    group at its deadline. If anything stops the batch, the pool is closed: its
    running handlers finish and their outcomes are recorded, what no thread started
    is handed back.
    """
    using, marks = relay.using, relay._marks
    handled = running = index = 0
    try:
        while index < len(claimed) or running:
            if index < len(claimed) and (relay.stopping or time.monotonic() - started > lease / 2):
                marks.flush()
                _hand_back(using, [c.message for c in claimed[index:]])
                index = len(claimed)
                continue
            if index < len(claimed) and running < pool.size:
                item = claimed[index]
                index += 1  # first: claimed[index:] is never handed to a thread
                running += 1
                pool.submit(item)
                continue
            left = marks.time_left()
            outcome = pool.result(None if left is None else max(left, 0.0))
            if outcome is None:  # the group's deadline came first, or stop() woke us
                if marks.due():
                    marks.flush()
                continue
            item, error = outcome
            running -= 1
            handled += 1
            relay.handled += 1
            if error is None:
                marks.add(item)
            elif isinstance(error, Exception):
                _fail(using, item.message, error)
                if isinstance(error, relay.stop_on):
                    raise error
            else:  # SystemExit, KeyboardInterrupt in a handler: stop as inline would
                raise error
            if marks.due():
                marks.flush()
    except BaseException:
        relay._pool = None
        _hand_back_quietly(using, [*pool.cancel(), *claimed[index:]])
        _not_started, outcomes = pool.close()  # the running handlers finish first
        _record(relay, outcomes)
        raise
    return handled


def _record(relay: Relay, outcomes: list[tuple[_Claimed, BaseException | None]]) -> None:
    """Record the outcomes of handlers that finished while the batch was stopping."""
    for item, error in outcomes:
        try:
            if error is None:
                relay.handled += 1
                relay._marks.add(item)  # written by close(), or kept for a later try
            elif isinstance(error, Exception):
                relay.handled += 1
                _fail(relay.using, item.message, error)
            # else: the handler itself was stopped; its message stays leased
        except Exception as exc:
            logger.warning("outbox message %s: outcome not recorded: %s", item.message.pk, exc)


class _Pool:
    """``size`` threads running handlers; each closes its own connections at the end."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._inbox: queue.SimpleQueue[_Claimed | None] = queue.SimpleQueue()
        # None: a wake-up call (Relay.stop), not an outcome.
        self._outbox: queue.SimpleQueue[tuple[_Claimed, BaseException | None] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"outbox-relay-{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, item: _Claimed) -> None:
        self._inbox.put(item)

    def result(self, timeout: float | None) -> tuple[_Claimed, BaseException | None] | None:
        """The next finished handler's message and error.

        ``None`` after ``timeout`` seconds, or when :meth:`wake` was called.
        """
        try:
            return self._outbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def wake(self) -> None:
        """Make a waiting :meth:`result` return ``None`` now.

        Safe in a signal handler: ``SimpleQueue.put`` is reentrant.
        """
        self._outbox.put(None)

    def cancel(self) -> list[_Claimed]:
        """Take back the messages submitted that no thread started yet."""
        not_started: list[_Claimed] = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._inbox.get_nowait()
                if item is not None:
                    not_started.append(item)
        return not_started

    def close(self) -> tuple[list[_Claimed], list[tuple[_Claimed, BaseException | None]]]:
        """Let the threads finish the handlers they run, then stop them.

        Returns:
            The messages submitted that no thread started, and the outcomes of the
            handlers that finished but were not taken with :meth:`result` yet.
        """
        outcomes: list[tuple[_Claimed, BaseException | None]] = []
        if self._closed:
            return [], outcomes
        self._closed = True
        not_started = self.cancel()
        for _ in self._threads:
            self._inbox.put(None)
        for thread in self._threads:
            thread.join()
        with contextlib.suppress(queue.Empty):
            while True:
                outcome = self._outbox.get_nowait()
                if outcome is not None:
                    outcomes.append(outcome)
        return not_started, outcomes

    def _work(self) -> None:
        try:
            while (item := self._inbox.get()) is not None:
                error: BaseException | None
                try:
                    error = _call(item.message)
                except BaseException as exc:  # reported to the relay's thread
                    error = exc
                self._outbox.put((item, error))
                if error is not None:
                    _discard_broken_connections()
        finally:
            connections.close_all()


def _discard_broken_connections() -> None:
    """Close this thread's connections that a database error left unusable.

    A handler that met a dead connection (a restarted server, a terminated backend)
    would hand it to every later handler on this thread; closed, the next query
    connects afresh. Called after a handler raised (a few microseconds: not after
    every handler), and a round trip only for a connection an error occurred on.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or not conn.errors_occurred or conn.in_atomic_block:
            continue
        try:
            usable = conn.is_usable()
        except Exception:
            usable = False
        if usable:
            conn.errors_occurred = False
        else:
            with contextlib.suppress(Exception):
                conn.close()


def deliver_due(
    batch_size: int | None = None,
    *,
    using: str | None = None,
    max_batches: int = 10,
    threads: int | None = None,
    stop_on: tuple[type[BaseException], ...] = (),
) -> int:
    """Run :func:`deliver_batch` until a batch comes back short, at most ``max_batches``.

    Args:
        batch_size: most messages claimed per batch (default ``OUTBOX_BATCH_SIZE``).
        using: database alias (default: the router's choice for ``OutboxMessage``).
        max_batches: batches at most.
        threads: handlers run at the same time (default ``OUTBOX_RELAY_THREADS``).
        stop_on: exception types of handlers that stop the run (:class:`Relay`).

    Returns:
        Messages handled in all batches.

    Raises:
        django.db.DatabaseError: the database failed; what was delivered is marked if
            the database lets it, the rest stays leased (:class:`Relay`).
    """
    limit = conf.outbox_batch_size if batch_size is None else int(batch_size)
    total = 0
    with Relay(using, threads=threads, stop_on=stop_on) as relay:
        for _ in range(max_batches):
            handled = relay.deliver_batch(limit)
            total += handled
            if handled < limit:
                break
    return total


def _claim(using: str, limit: int, lease: float) -> tuple[list[_Claimed], int]:
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
    "attempt {attempts} never reported back: the relay died or the handler outlived the relay lease"
)


def _messages(rows: list[tuple[Any, ...]], using: str) -> list[_Claimed]:
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
            built.append(_Claimed(message, row[8]))
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
        claimed.append(_Claimed(message, row[8]))
    return claimed


def _payload(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _claim_generic(using: str, limit: int, lease: float) -> list[_Claimed]:
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
        _Claimed(
            messages[pk],
            (moment - clock.from_db(messages[pk].created_at, connection)).total_seconds(),
        )
        for pk in won
    ]


def _fenced(using: str, message: OutboxMessage) -> Any:
    """The message, if it is still pending under the claim this relay made.

    A claim is identified by the lease end it set (``available_at``) and the attempt
    count it reached; a relay that took the message over changed both.
    """
    return OutboxMessage.objects.using(using).filter(
        pk=message.pk,
        state=OutboxState.PENDING,
        attempts=message.attempts,
        available_at=clock.to_db(message.available_at, connections[using]),
    )


def _call(message: OutboxMessage) -> Exception | None:
    """Call the message's handler; returns the exception it raised, if any."""
    handler = handlers.get_handler(message.topic)
    try:
        if handler is None:
            raise LookupError(
                f"no outbox handler is registered for topic {message.topic!r}: register "
                "one with @outbox.handler(topic) in a module the relay imports "
                f"(e.g. <app>.{handlers.HANDLER_MODULE})"
            )
        handler(message, message.dedup_key)
    except Exception as exc:
        return exc
    return None


def _report_sent(item: _Claimed) -> None:
    """The ``delivered`` signal of a message whose mark was committed."""
    delivered.send(
        item.message.topic, message_id=item.message.pk, attempts=item.message.attempts, lag=item.age
    )


def _bury_abandoned(using: str) -> int:
    """Dead-letter due messages that used up their attempts without a verdict.

    ``attempts`` counts deliveries started. A message that is due again after its last
    allowed attempt was claimed never reported back: the relay was killed (a poison
    message that crashes it, a hard time limit) or its handler outlived the lease. It
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
    dead_lettered.send(topic, message_id=pk, attempts=attempts, error=None)


def _fail(using: str, message: OutboxMessage, exc: Exception) -> None:
    error = "".join(traceback.format_exception(exc))[-_LAST_ERROR_CHARS:]
    if message.attempts >= conf.outbox_max_attempts:
        updated = _fenced(using, message).update(
            state=OutboxState.DEAD, last_error=error, available_at=now(using)
        )
        if updated:
            logger.error(
                "outbox message %s (%s) dead after %s attempts: %s",
                message.pk,
                message.topic,
                message.attempts,
                exc,
            )
            dead_lettered.send(
                message.topic, message_id=message.pk, attempts=message.attempts, error=exc
            )
        return
    delay = backoff(message.attempts, base=conf.outbox_backoff_base, cap=conf.outbox_backoff_cap)
    if _fenced(using, message).update(last_error=error, available_at=now(using, delay)):
        logger.warning(
            "outbox message %s (%s) failed (attempt %s), retry in %.1f s: %s",
            message.pk,
            message.topic,
            message.attempts,
            delay,
            exc,
        )
        failed.send(
            message.topic,
            message_id=message.pk,
            attempts=message.attempts,
            error=exc,
            retry_in=delay,
        )


def _hand_back(using: str, messages: list[OutboxMessage]) -> None:
    """Return claimed messages no handler saw: due now, the claim's attempt undone.

    Fenced by the claim's lease end (every message of a batch got the same one): a
    message another relay claimed after this relay's lease ran out is left alone.
    """
    if not messages:
        return
    OutboxMessage.objects.using(using).filter(
        pk__in=[m.pk for m in messages],
        state=OutboxState.PENDING,
        # still this claim: every message of a batch got the same lease end
        available_at=clock.to_db(messages[0].available_at, connections[using]),
    ).update(attempts=F("attempts") - 1, available_at=now(using))


def _hand_back_quietly(using: str, claimed: list[_Claimed]) -> None:
    """:func:`_hand_back` while a batch stops on an error.

    A failure is logged, not raised: the messages stay leased and are delivered after
    the lease.
    """
    if not claimed:
        return
    try:
        _hand_back(using, [c.message for c in claimed])
    except Exception as exc:
        logger.warning(
            "%d claimed outbox message(s) not handed back (delivered after the relay lease): %s",
            len(claimed),
            exc,
        )
