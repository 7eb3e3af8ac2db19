"""Moving the idempotency clock in tests: :func:`travel` and :func:`past_lease`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django_idempotency.conf import conf
from django_idempotency.store import clock


@contextmanager
def travel(seconds: float) -> Iterator[None]:
    """Move the idempotency clock ``seconds`` forward (or back) inside the block.

    Works on PostgreSQL, where leases follow the database's clock and ``time-machine``
    cannot reach them, and on SQLite. Nests: offsets add up.

    Args:
        seconds: how far to move, in seconds; may be negative.
    """
    before = clock.offset()
    clock.set_offset(before + seconds)
    try:
        yield
    finally:
        clock.set_offset(before)


@contextmanager
def past_lease(lease: float | None = None, *, margin: float = 1.0) -> Iterator[None]:
    """Inside the block, every lease claimed before it has run out.

    A retry sent inside the block finds the earlier attempt's claim expired and takes
    it over (a new owner token); the earlier attempt, if it is still running, is then
    fenced off when it tries to store its response (409 ``lease-lost``).

    Args:
        lease: the view's lease in seconds (its ``lease=`` option); default: the
            ``LEASE`` setting.
        margin: seconds past the lease's end (default 1).
    """
    with travel((conf.lease if lease is None else float(lease)) + margin):
        yield
