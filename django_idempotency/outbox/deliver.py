"""The relay's second step: call the handlers (docs/outbox.md).

:func:`call` runs a message's handler outside any transaction the relay holds, with
the message and its dedup key; the relay calls it on its own thread (``threads=1``) or
hands the messages to a :class:`Pool`, a bounded set of threads with database
connections of their own. A thread whose handler raised closes the connections the
error left unusable (:func:`discard_broken_connections`).
"""

from __future__ import annotations

import contextlib
import queue
import threading

from django.db import connections

from django_idempotency.models import OutboxMessage
from django_idempotency.outbox import handlers
from django_idempotency.outbox.claim import Claimed
from django_idempotency.store.tenants import enter_schema


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
                    error = call(item.message)
                except BaseException as exc:  # reported to the relay's thread
                    error = exc
                self._outbox.put((item, error))
                if error is not None:
                    discard_broken_connections()
        finally:
            connections.close_all()


def discard_broken_connections() -> None:
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


def call(message: OutboxMessage) -> Exception | None:
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
