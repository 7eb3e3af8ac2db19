"""Helpers for the tests of projects that use django-idempotency."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from . import clock


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
