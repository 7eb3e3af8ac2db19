"""The relay's marks: delivered messages marked ``sent`` in groups (docs/outbox.md).

A delivered message is not marked on its own: :class:`Marks` keeps it in the current
*group* and writes the whole group in one fenced UPDATE once the group's oldest mark
is ``max_age`` seconds old (``OUTBOX_MARK_DELAY``), and whenever the relay asks
(before a handler starts when the group is due, at the end of the batch). A handler
that blocks while a group waits must not keep it unwritten (a relay killed then would
deliver those messages again), so a **watchdog** thread, started with the relay's first
batch and kept until :meth:`Marks.close`, writes the group at its deadline on a
database connection of its own; it also tends the relay's lease (``outbox.lease``:
renewals, the hand-back at half the lease) while a handler blocks. A mark is therefore
committed at most about ``max_age`` seconds (plus one UPDATE) after its handler
returned, whatever later handlers do, unless the database fails; then the watchdog
retries on a new connection, and the messages not marked before their lease ends are
delivered again after it (at least once).

Every write is fenced by the claim: the message must still be ``pending`` with the
attempt count this relay's claim gave it and a lease end (``available_at``) no earlier
than the claim's (the relay renews its lease, ``outbox.lease``). Messages a relay with
a later claim took over (its claim counted an attempt) are left alone, and logged.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from django.db import connections

from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox.lease import Holding
from django_idempotency.store import clock
from django_idempotency.store.tenants import enter_schema

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
#: Seconds the watchdog waits before it tries a failed write again; doubled after each
#: further failure, up to ``_RETRY_CAP``.
_RETRY_AFTER = 0.1
_RETRY_CAP = 2.0


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
    """The delivered messages of one batch that are not marked ``sent`` yet.

    Thread-safe: handlers' outcomes may be added from any thread, and the watchdog
    writes from its own. ``on_sent`` runs on the thread that wrote the group: the
    relay's, or the watchdog's.

    Args:
        using: database alias.
        max_age: seconds a mark may wait in its group before the group is written;
            ``0`` writes each mark before the next handler starts.
        on_sent: called with each claimed message once its mark is committed.
        schema: the tenant schema (django-tenants) the watchdog's connection runs in,
            the relay's; ``None``: the connection's own.
        holding: the relay's lease over its messages (``outbox.lease``): the watchdog
            tends it while a handler blocks; a written mark ends the message's hold.
    """

    def __init__(
        self,
        using: str,
        max_age: float,
        on_sent: Callable[[Any], None],
        *,
        schema: str | None = None,
        holding: Holding | None = None,
    ) -> None:
        self.using = using
        self.holding = holding if holding is not None else Holding(using)
        self.holding.wake = self._wake
        self.schema = schema
        self.max_age = max_age
        self._on_sent = on_sent
        self._cond = threading.Condition()
        self._pending: list[Delivered] = []
        self._oldest = 0.0
        self._stopped = False
        self._watchdog: threading.Thread | None = None
        #: Write each mark as it is added (no writer thread): inside a transaction,
        #: on databases other than PostgreSQL.
        self.sync = False

    @property
    def pending(self) -> int:
        """Marks waiting to be written."""
        return len(self._pending)

    def ids(self) -> list[int]:
        """The ids of the messages whose marks wait to be written."""
        with self._cond:
            return [item.message.pk for item in self._pending]

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def add(self, item: Delivered) -> None:
        """Add the mark of a message whose handler returned."""
        with self._cond:
            if not self._pending:
                self._oldest = time.monotonic()
                self._cond.notify_all()
            self._pending.append(item)
        if self.sync:
            self.flush()

    def time_left(self) -> float | None:
        """Seconds until the group is due (``<= 0``: due); ``None``: no marks pending."""
        if not self._pending:
            return None
        return self._oldest + self.max_age - time.monotonic()

    def due(self) -> bool:
        """Whether the group's oldest mark is ``max_age`` old: write it now."""
        left = self.time_left()
        return left is not None and left <= 0

    def before_handler(self) -> None:
        """Call before a handler starts: write the group if due, else arm the watchdog.

        The watchdog then writes the group at its deadline even if the handler blocks.
        """
        if not self._pending:
            return
        if self.due():
            self.flush()
        else:
            self._arm()

    def hand_off(self) -> None:
        """Have the writer thread write the pending marks now; do not wait for it."""
        if not self._pending:
            return
        with self._cond:
            self._oldest = -math.inf
            self._cond.notify_all()
        self._arm()

    def arm(self) -> None:
        """Start the watchdog, if not running: it writes groups and tends the lease."""
        self._arm()

    def _arm(self) -> None:
        if self._watchdog is None:
            with self._cond:
                self._stopped = False
            self._watchdog = threading.Thread(
                target=self._watch, name="outbox-marks-writer", daemon=True
            )
            self._watchdog.start()

    def flush(self) -> None:
        """Write every pending mark now.

        Raises:
            django.db.DatabaseError: the database failed; the marks stay pending.
        """
        self._write()

    def close(self) -> None:
        """Stop the watchdog and write what is pending: the batch is over.

        Raises:
            django.db.DatabaseError: the database failed; the messages not marked stay
                leased and are delivered again after the lease.
        """
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._watchdog is not None:
            self._watchdog.join()
            self._watchdog = None
        self.flush()

    def _take(self) -> list[Delivered]:
        with self._cond:
            taken, self._pending = self._pending, []
            return taken

    def _write(self) -> None:
        taken = self._take()
        if not taken:
            return
        try:
            mine = write_sent(self.using, taken)
            self.holding.release(item.message.pk for item in taken)
        except BaseException:
            self._give_back(taken)
            raise
        if len(mine) != len(taken):
            logger.warning(
                "%d outbox message(s) were taken over by another relay while delivered",
                len(taken) - len(mine),
            )
        for item in taken:
            if item.message.pk in mine:
                self._on_sent(item)

    def _give_back(self, taken: list[Delivered]) -> None:
        with self._cond:
            self._pending[:0] = taken
            self._oldest = time.monotonic() - self.max_age  # due: they are old

    def _watch(self) -> None:
        """The watchdog: write the group when its deadline passes; own connections.

        It outlives failures: after any error (the database down, its connection
        terminated, a ``delivered`` receiver raising) it closes its connection, so the
        next try connects afresh, and tries again after a pause doubling from
        ``_RETRY_AFTER`` up to ``_RETRY_CAP`` seconds. The first failure of a run of
        them is logged as a warning, the recovery as info.
        """
        failures = 0
        try:
            enter_schema(self.using, self.schema)
            while True:
                with self._cond:
                    if self._stopped:
                        return
                    left = _earliest(self.time_left(), self.holding.time_left())
                    if left is None or left > 0:
                        self._cond.wait(left)
                        continue
                try:
                    if self.due():
                        self._write()
                    self.holding.tend()
                except Exception as exc:
                    failures += 1
                    _close_connection(self.using)
                    log = logger.warning if failures == 1 else logger.debug
                    log("outbox marks not written yet, will retry: %s", exc)
                    pause = min(_RETRY_CAP, _RETRY_AFTER * 2.0 ** (failures - 1))
                    with self._cond:
                        if not self._stopped:
                            self._cond.wait(pause)
                    continue
                if failures:
                    logger.info("outbox marks written again after %d failed tries", failures)
                    failures = 0
        finally:
            _close_connections()  # a ``delivered`` receiver may have used other aliases


def _earliest(*lefts: float | None) -> float | None:
    """The smallest of the seconds given; ``None`` if none is."""
    known = [left for left in lefts if left is not None]
    return min(known) if known else None


def _close_connections() -> None:
    """Close every connection of this thread, broken or not: the thread is ending."""
    for conn in connections.all(initialized_only=True):
        with contextlib.suppress(Exception):
            conn.close()


def _close_connection(using: str) -> None:
    """Close this thread's connection to ``using``, broken or not."""
    with contextlib.suppress(Exception):
        connections[using].close()
