"""The relay's second step: call the handlers, one by one or in a thread pool.

Handlers run outside any transaction the relay holds, each with the message and its
dedup key, on the relay's thread (``threads=1``) or on a bounded pool whose threads
have database connections of their own. The batch is held under the relay lease
(``outbox.lease``): renewed while handlers run; once half the lease has gone since the
claim, no handler starts and the rest of the batch is handed back; a stop
(:meth:`Relay.stop`, an exception) lets the running handlers finish, and what they
returned is recorded.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import TYPE_CHECKING

from django.db import connections

from django_idempotency.models import OutboxMessage
from django_idempotency.outbox import handlers
from django_idempotency.outbox.claim import Claimed
from django_idempotency.store.tenants import enter_schema

logger = logging.getLogger("django_idempotency.outbox")

if TYPE_CHECKING:
    from django_idempotency.outbox.relay import Relay


def deliver_inline(relay: Relay) -> int:
    """Run the handlers one by one on this thread.

    The batch is held by ``relay._marks.holding``: it gives the next message, or none
    once half the lease has gone or the relay stops (the rest handed back).
    """
    marks = relay._marks
    holding = marks.holding
    handled = 0
    try:
        while True:
            holding.tend()  # between handlers; the watchdog while one blocks
            item = holding.take(relay.stopping)
            if item is None:
                break
            marks.before_handler()  # written now if due, else by its deadline
            error = _call(item.message)
            if error is not None or connections[relay.using].errors_occurred:
                _discard_broken_connections()
            handled += 1
            relay.handled += 1
            if error is None:
                marks.add(item)
                relay.outcomes["delivered"] += 1
            else:
                relay.outcomes[holding.fail(item, error) or "taken over"] += 1
                if isinstance(error, relay.stop_on):
                    raise error
    except BaseException:
        holding.give_back_quietly()
        raise
    return handled


def deliver_pooled(relay: Relay, pool: Pool) -> int:
    """Run the handlers on the pool's threads.

    Marks and failures are written here, on the relay's thread and connection, a
    group at its deadline; the watchdog tends the lease. If anything stops the batch,
    the pool is closed: its running handlers finish and their outcomes are recorded,
    what no thread started is handed back.
    """
    marks = relay._marks
    holding = marks.holding
    handled = running = 0
    more = True  # the batch may still give a message to start
    try:
        while more or running:
            if more and running < pool.size:
                item = holding.take(relay.stopping)
                if item is None:
                    more = False
                    continue
                running += 1
                pool.submit(item)
                continue
            left = _earliest(marks.time_left(), holding.time_left())
            outcome = pool.result(None if left is None else max(left, 0.0))
            if outcome is None:  # a deadline came first, or stop() woke us
                if marks.due():
                    marks.flush()
                holding.tend()
                if relay.stopping:
                    more = more and holding.take(True) is not None
                continue
            item, error = outcome
            running -= 1
            handled += 1
            relay.handled += 1
            if error is None:
                marks.add(item)
                relay.outcomes["delivered"] += 1
            elif isinstance(error, Exception):
                relay.outcomes[holding.fail(item, error) or "taken over"] += 1
                if isinstance(error, relay.stop_on):
                    raise error
            else:  # SystemExit, KeyboardInterrupt in a handler: stop as inline would
                raise error
            if marks.due():
                marks.flush()
    except BaseException:
        relay._pool = None
        holding.give_back_quietly(pool.cancel())
        _not_started, outcomes = pool.close()  # the running handlers finish first
        _record(relay, outcomes)
        raise
    return handled


def _earliest(*lefts: float | None) -> float | None:
    """The smallest of the seconds given; ``None`` if none is."""
    known = [left for left in lefts if left is not None]
    return min(known) if known else None


def _record(relay: Relay, outcomes: list[tuple[Claimed, BaseException | None]]) -> None:
    """Record the outcomes of handlers that finished while the batch was stopping."""
    for item, error in outcomes:
        try:
            if error is None:
                relay.handled += 1
                relay._marks.add(item)  # written by close(), or kept for a later try
                relay.outcomes["delivered"] += 1
            elif isinstance(error, Exception):
                relay.handled += 1
                relay.outcomes[relay._marks.holding.fail(item, error) or "taken over"] += 1
            # else: the handler itself was stopped; its message stays leased
        except Exception as exc:
            logger.warning("outbox message %s: outcome not recorded: %s", item.message.pk, exc)


class Pool:
    """``size`` threads running handlers; each closes its own connections at the end.

    With ``schema`` (a tenant schema, django-tenants), each thread's connection to
    ``using`` runs in it, as the relay's does.
    """

    def __init__(self, size: int, using: str, schema: str | None = None) -> None:
        self.size = size
        self._using = using
        self._schema = schema
        self._inbox: queue.SimpleQueue[Claimed | None] = queue.SimpleQueue()
        # None: a wake-up call (Relay.stop), not an outcome.
        self._outbox: queue.SimpleQueue[tuple[Claimed, BaseException | None] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"outbox-relay-{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, item: Claimed) -> None:
        """Queue ``item`` for the next free thread."""
        self._inbox.put(item)

    def result(self, timeout: float | None) -> tuple[Claimed, BaseException | None] | None:
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

    def cancel(self) -> list[Claimed]:
        """Take back the messages submitted that no thread started yet."""
        not_started: list[Claimed] = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._inbox.get_nowait()
                if item is not None:
                    not_started.append(item)
        return not_started

    def close(self) -> tuple[list[Claimed], list[tuple[Claimed, BaseException | None]]]:
        """Let the threads finish the handlers they run, then stop them.

        Returns:
            The messages submitted that no thread started, and the outcomes of the
            handlers that finished but were not taken with :meth:`result` yet.
        """
        outcomes: list[tuple[Claimed, BaseException | None]] = []
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
            enter_schema(self._using, self._schema)
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
