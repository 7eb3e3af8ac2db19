"""The on-commit kick: start the Celery relay task soon after a commit (docs/outbox.md).

A commit that enqueued messages kicks the relay task, so delivery need not wait for
the next beat. The kick is best effort and never slows the request that commits: the
request only queues it for this process's **kicker** thread (microseconds), which
sends the task with Celery's publish retries off. Kicks queued while one is being
sent are coalesced, one per Celery app and database alias. A broker that is down or
unreachable is logged once per outage (a ``WARNING`` without traceback when kicks
start failing, an ``INFO`` when one gets through again); the relay's schedule (the
beat, or the ``idempotency_relay`` command) delivers the messages meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from django_idempotency.conf import conf

logger = logging.getLogger("django_idempotency.outbox")

#: The name of the relay's Celery task (``django_idempotency.tasks.relay_outbox``).
RELAY_TASK = "django_idempotency.relay_outbox"


def kick(using: str | None = None) -> bool:
    """Have the Celery relay task started soon, if Celery is installed and configured.

    "Configured" means the current Celery app (of the calling thread) has a
    ``broker_url``: a project that installed Celery without setting up an app is left
    alone. The task is sent by this process's kicker thread, so this returns at once
    whatever the broker does; a broker that is down is logged (once per outage) and
    the relay's schedule delivers the messages later.

    Args:
        using: the database alias the relay task delivers (``None``: every alias).

    Returns:
        Whether a kick was queued: ``False`` when ``OUTBOX_KICK`` is off, Celery is
        not installed or its current app has no broker.
    """
    if not conf.outbox_kick:
        return False
    try:
        from celery import current_app  # type: ignore[import-untyped]
    except ImportError:  # Celery is not installed
        return False
    if not current_app.conf.broker_url:
        return False  # Celery installed, but no app set up: left alone
    # The calling thread's current app (Celery keeps it per thread): its bound method.
    _kicker.submit(current_app.send_task, using)
    return True


def wait_for_kicks(timeout: float | None = None) -> bool:
    """Wait until every kick queued in this process was sent or given up.

    For tests and for a process about to exit; requests never wait.

    Args:
        timeout: seconds at most (``None``: no limit).

    Returns:
        ``True`` when no kick is queued or being sent; ``False`` after ``timeout``.
    """
    return _kicker.wait(timeout)


class _Kicker:
    """One daemon thread per process sending the queued kicks, one after the other."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: (app id, alias) -> (the app's send_task, alias)
        self._queued: dict[tuple[int, str | None], tuple[Any, str | None]] = {}
        self._busy = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        #: Failed kicks in a row, by broker URL: one warning per outage of a broker.
        self._failures: dict[str, int] = {}

    def submit(self, send_task: Any, using: str | None) -> None:
        with self._cond:
            if self._pid != os.getpid():  # a forked child has no thread: start its own
                self._pid, self._thread, self._busy = os.getpid(), None, False
            self._queued[(id(send_task.__self__), using)] = (send_task, using)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="outbox-relay-kicker", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._queued and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued:
                    self._cond.wait()
                key = next(iter(self._queued))
                send_task, using = self._queued.pop(key)
                self._busy = True
            try:
                self._send(send_task, using)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, send_task: Any, using: str | None) -> None:
        broker = str(send_task.__self__.conf.broker_url)
        try:
            # By name (the task is django_idempotency.tasks.relay_outbox), without
            # Celery's publish retries: the relay's schedule is the retry.
            send_task(RELAY_TASK, kwargs={"using": using}, retry=False)
        except Exception as exc:
            failures = self._failures[broker] = self._failures.get(broker, 0) + 1
            if failures == 1:
                logger.warning(
                    "outbox relay task not sent, the broker is unavailable (%s: %s); the "
                    "relay's schedule (beat or idempotency_relay) delivers the messages. "
                    "Logged once until a kick gets through.",
                    type(exc).__name__,
                    exc,
                )
            return
        failures = self._failures.pop(broker, 0)
        if failures:
            logger.info("outbox relay task sent again after %d failed kick(s)", failures)


_kicker = _Kicker()
