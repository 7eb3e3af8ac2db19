"""The one clock that rules leases and retention (SPEC §4).

* PostgreSQL: the database server's clock, ``statement_timestamp()``, read inside the
  statement that needs it. Every app server shares it, so a skewed app-server clock can
  neither take over a live lease nor keep a dead one.
* SQLite and other backends: the application's clock (``django.utils.timezone.now``).
  SQLite is an embedded file on the app server's own disk, so the app server's clock
  *is* the database's clock; other backends are best effort (docs/storage.md).

Tests move time with :func:`django_idempotency.testing.travel`, which adds an offset
to both clocks, so the database-clock path is exercised with time travel and no sleeps.
On the application clock, ``time-machine`` works as well.
"""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

_offset_seconds: float = 0.0


def offset() -> float:
    """Seconds added to the clock; 0 outside tests."""
    return _offset_seconds


def set_offset(seconds: float) -> None:
    """Shift the clock by ``seconds`` (tests only; see ``testing.travel``)."""
    global _offset_seconds
    _offset_seconds = float(seconds)


def app_now() -> dt.datetime:
    """The application clock plus the test offset, timezone-aware (UTC)."""
    return timezone.now() + dt.timedelta(seconds=_offset_seconds)
