"""The automatic heartbeat: a view's lease extended while it runs (``heartbeat=True``).

A background thread extends the claim's lease every third of the lease, with its own
database connection (so each extension commits at once, beside the view's open
transaction), until the view returns or raises. On a schema-per-tenant database
(django-tenants) that connection runs in the request's schema (docs/tenants.md). The
thread is a daemon: it dies with its process, and the lease then runs out (or, on a
direct PostgreSQL connection, the owner's presence lock goes at once:
docs/robustness.md#owner-presence). A claim found taken over stops it. The manual
``request.idempotency.extend_lease()`` still works.

PostgreSQL only, at READ COMMITTED: SQLite has one writer, which the view holds, and
above READ COMMITTED a lease extended beside the view's transaction would make its
own completion fail (``exceptions.HeartbeatUnavailable``). Elsewhere the heartbeat is not
started and a warning is logged once per process and database.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, InterfaceError, connections

from django_idempotency import signals
from django_idempotency.logs import scope_fields
from django_idempotency.store import tenants
from django_idempotency.store.isolation import stricter_than_read_committed
from django_idempotency.store.settle import extend
from django_idempotency.store.values import Claim

logger = logging.getLogger("django_idempotency")

_warned: set[str] = set()


def available(using: str) -> bool:
    """Whether the automatic heartbeat can run on database ``using`` (see module)."""
    connection = connections[using]
    return connection.vendor == "postgresql" and not stricter_than_read_committed(connection)


class Heartbeat:
    """A daemon thread extending ``claim``'s lease by ``lease`` seconds every ``lease / 3``.

    Args:
        claim: the claim to keep.
        lease: seconds; the lease each beat sets, and three times the beat's period.
    """

    def __init__(self, claim: Claim, lease: float) -> None:
        self.claim = claim
        self.lease = lease
        self.interval = lease / 3.0
        self.beats = 0
        # Taken in the request's thread: the beating thread's own connection starts in
        # django-tenants' public schema, whose table (if any) is not the claim's.
        self._place = tenants.place_of(connections[claim.using])
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"idempotency-heartbeat-{claim.record_id}", daemon=True
        )

    def start(self) -> None:
        """Start beating (the first beat is one interval from now)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and wait for a beat in progress (one UPDATE) to end."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        kwargs = scope_fields(self.claim.scope)
        try:
            tenants.enter(self.claim.using, self._place)  # kept by the wrapper across a close
            while not self._stop.wait(self.interval):
                try:
                    kept = extend(self.claim, self.lease)
                except (DatabaseError, InterfaceError) as exc:  # try again next beat
                    logger.warning("heartbeat could not extend the lease: %s", exc, extra=kwargs)
                    connections[self.claim.using].close()
                    continue
                self.beats += 1
                signals.extended.send(
                    self.claim.scope.endpoint, seconds=self.lease, kept=kept, **kwargs
                )
                if not kept:
                    logger.warning("heartbeat found the claim taken over; stopped", extra=kwargs)
                    return
        finally:
            connections[self.claim.using].close()  # this thread's own connection


@contextmanager
def beating(claim: Claim, lease: float, enabled: bool) -> Iterator[Heartbeat | None]:
    """Run a :class:`Heartbeat` for ``claim`` inside the block, if ``enabled`` and available."""
    if not enabled:
        yield None
        return
    if not available(claim.using):
        if claim.using not in _warned:
            _warned.add(claim.using)
            logger.warning(
                "heartbeat=True needs PostgreSQL at READ COMMITTED; database %r is not: "
                "no automatic heartbeat, give such views a lease longer than their run",
                claim.using,
            )
        yield None
        return
    beat = Heartbeat(claim, lease)
    beat.start()
    try:
        yield beat
    finally:
        beat.stop()
