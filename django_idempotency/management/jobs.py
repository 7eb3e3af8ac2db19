"""What the long-running jobs share: riding out database outages, stopping on SIGTERM.

The jobs are the relay command, the sweeper's ``--loop`` and the Celery tasks
(docs/operations.md, "Outages and stopping"). They outlive a database that goes away
for a while (a server restart, a failover, a terminated backend, a network cut): an
:class:`Outage` per job and database logs the outage once when it starts (``ERROR``)
and once when it ends (``INFO``), never a traceback per retry, and spaces the retries
with a bounded exponential backoff with jitter. The connection the failure left
behind is closed, so the next try connects afresh. :class:`GracefulStop` turns
``SIGTERM`` (``kill``, a container stop) into a stop after the work in hand.

What counts as an outage (:data:`UNAVAILABLE`): ``OperationalError`` (connection
refused or lost, the server shutting down or starting up, a backend terminated, a
timeout) and ``InterfaceError`` (a connection the driver already closed). Other
database errors (a missing table, a syntax error) are bugs or deployment mistakes and
propagate.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

#: The errors that mean "the database is unavailable": retried, not raised.
UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


class Outage:
    """One job's view of one database: up, or down since when, and when to retry.

    Args:
        job: what is running, for the log lines (``"outbox relay"``).
        alias: the database alias.
        logger: where the two lines of an outage go.
        then: what happens next, for the first line (``"retrying with backoff"``).
        base: seconds of the first pause after a failure (at least half of it is
            waited, the rest is jitter).
        cap: most seconds of a pause.
        rand: ``() -> float`` in ``[0, 1)``; injectable for tests.
    """

    def __init__(
        self,
        job: str,
        alias: str,
        logger: logging.Logger,
        *,
        then: str = "retrying with backoff",
        base: float = 0.5,
        cap: float = 30.0,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.job = job
        self.alias = alias
        self.logger = logger
        self.then = then
        self.base = base
        self.cap = cap
        self.rand = rand
        #: Failed tries in a row; 0 while the database is up.
        self.failures = 0
        #: ``time.monotonic()`` of the first failure of the outage.
        self.since = 0.0
        #: ``time.monotonic()`` before which the next try should not start.
        self.retry_at = 0.0

    @property
    def down(self) -> bool:
        """Whether the last try failed."""
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        """Record a failed try: log it if it starts an outage, close the connection.

        Args:
            exc: the error of the try.

        Returns:
            Seconds to wait before the next try ("equal jitter": between half and
            all of ``min(cap, base * 2 ** (failures - 1))``).
        """
        self.failures += 1
        now = time.monotonic()
        if self.failures == 1:
            self.since = now
            self.logger.error(
                "%s: database %r unavailable (%s: %s); %s",
                self.job,
                self.alias,
                type(exc).__name__,
                str(exc).strip(),
                self.then,
            )
        else:
            self.logger.debug(
                "%s: database %r still unavailable (try %d): %s",
                self.job,
                self.alias,
                self.failures,
                str(exc).strip(),
            )
        with contextlib.suppress(Exception):
            connections[self.alias].close()
        ceiling = min(self.cap, self.base * 2.0 ** (self.failures - 1))
        delay = ceiling / 2 + float(self.rand()) * ceiling / 2
        self.retry_at = now + delay
        return delay

    def recovered(self) -> None:
        """Record a successful try: log the end of the outage if there was one."""
        if not self.failures:
            return
        self.logger.info(
            "%s: database %r available again after %.1f s (%d failed tries)",
            self.job,
            self.alias,
            time.monotonic() - self.since,
            self.failures,
        )
        self.failures = 0
        self.retry_at = 0.0


#: One :class:`Outage` per (job, alias) in this process, for jobs that start afresh
#: each time (Celery tasks): an outage spanning many runs is logged once.
_known: dict[tuple[str, str], Outage] = {}


def for_job(job: str, alias: str, logger: logging.Logger, *, then: str) -> Outage:
    """The :class:`Outage` of ``job`` on ``alias`` in this process, kept across calls."""
    outage = _known.get((job, alias))
    if outage is None:
        outage = _known[(job, alias)] = Outage(job, alias, logger, then=then)
    return outage


class _Idle(BaseException):
    """Raised by the SIGTERM handler when the job was idle (sleeping)."""


class GracefulStop:
    """``SIGTERM`` as a graceful stop, for the ``with`` block.

    The first ``SIGTERM`` sets :attr:`requested`, calls each ``on_stop`` (e.g.
    ``Relay.stop``: it must be safe in a signal handler) and ends :meth:`sleep` at
    once; the job finishes the work in hand and returns. A second ``SIGTERM`` raises
    ``KeyboardInterrupt``, as Ctrl-C does. Installed only in the main thread (Python
    delivers signals there); the previous handler is restored when the block ends.

    Args:
        on_stop: called on the first ``SIGTERM``, in the signal handler.
    """

    def __init__(self, *on_stop: Callable[[], None]) -> None:
        self.on_stop = on_stop
        #: Whether a SIGTERM arrived.
        self.requested = False
        self._idle = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
        return isinstance(exc, _Idle)  # a SIGTERM just after a sleep ended: stopped

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        for stop in self.on_stop:
            stop()
        if self._idle:  # nothing runs: end the sleep now
            raise _Idle

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or until ``SIGTERM``: a poll interval or a backoff."""
        try:
            self._idle = True
            if not self.requested and seconds > 0:
                time.sleep(seconds)
        except _Idle:
            pass
        finally:
            self._idle = False


class OwnConnections:
    """The calling thread's database connections a job opens, closed when the block ends.

    A process that runs the job and lives on (a Celery worker, a script or a test
    calling ``call_command``) keeps no server session of it: each connection of the
    calling thread that was not open when the block started is closed when it ends,
    however it ends (a return, ``SIGTERM``, an exception). A connection open before
    (the caller's) is left open, and so is one inside a transaction (``atomic``).
    Connections of the job's own threads are closed by those threads.
    """

    def __init__(self) -> None:
        self._open: set[str] = set()

    def __enter__(self) -> OwnConnections:
        self._open = {
            conn.alias
            for conn in connections.all(initialized_only=True)
            if conn.connection is not None
        }
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        for conn in connections.all(initialized_only=True):
            if conn.alias in self._open or conn.connection is None or conn.in_atomic_block:
                continue
            with contextlib.suppress(DatabaseError):  # a broken connection is closed anyway
                conn.close()
