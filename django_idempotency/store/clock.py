"""The one clock that rules leases and retention (docs/storage.md, "The clock", "Time zones").

* PostgreSQL: the database server's clock, ``statement_timestamp()``, read inside the
  statement that needs it. Every app server shares it, so a skewed app-server clock can
  neither take over a live lease nor keep a dead one.
* SQLite and other backends: the application's clock, :func:`app_now`. SQLite is an
  embedded file on the app server's own disk, so the app server's clock *is* the
  database's clock; other backends are best effort (docs/storage.md).

Both clocks count real elapsed time in UTC, whatever ``USE_TZ`` and ``TIME_ZONE`` say:
a lease of 30 seconds lasts 30 seconds across a daylight-saving change. With
``USE_TZ = False`` the store still computes in aware UTC and hands the database what it
expects (:func:`to_db`): naive *UTC* datetimes on SQLite and other naive-column
backends, never naive local time, so stored values do not depend on ``TIME_ZONE``.
PostgreSQL columns are ``timestamptz`` (instants) in either mode.

Tests move time with :func:`django_idempotency.testing.travel`, which adds an offset
to both clocks, so the database-clock path is exercised with time travel and no sleeps.
On the application clock, ``time-machine`` works as well.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
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
    """The application clock plus the test offset: aware UTC, whatever ``USE_TZ`` is."""
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=_offset_seconds)


def aware(value: dt.datetime) -> dt.datetime:
    """``value`` as an aware UTC datetime, for a datetime given by a caller.

    Args:
        value: an aware datetime, or a naive one, read as local time in
            ``TIME_ZONE`` (Django's rule for naive datetimes).

    Returns:
        The same instant, with ``tzinfo`` UTC.
    """
    if timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.get_default_timezone())
    return value.astimezone(dt.UTC)


def to_db(value: dt.datetime, connection: BaseDatabaseWrapper) -> dt.datetime:
    """An instant as a value for ORM queries on ``connection``'s datetime columns.

    Args:
        value: an aware datetime (any zone). A naive one is passed on unchanged: it
            is taken to be a value read from the same database (already in its form).
        connection: the database connection the query runs on.

    Returns:
        ``value`` itself with ``USE_TZ = True``, and on backends whose columns hold
        instants (PostgreSQL's ``timestamptz``: the driver sends the offset, where a
        naive value would be read in the session's ``TIME_ZONE``, ambiguous once a
        year). Elsewhere with ``USE_TZ = False``: the naive UTC datetime.
    """
    if settings.USE_TZ or timezone.is_naive(value) or connection.features.supports_timezones:
        return value
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def from_db(value: dt.datetime, connection: BaseDatabaseWrapper) -> dt.datetime:
    """A datetime read through the ORM from ``connection``, as an aware UTC datetime.

    Args:
        value: aware (``USE_TZ = True``) or naive. A naive value is UTC (what
            :func:`to_db` writes) except on PostgreSQL, where Django reads
            ``timestamptz`` columns in ``TIME_ZONE``; that reading is ambiguous in the
            hour repeated when clocks go back, so the store never relies on it.
        connection: the database connection the value was read from.

    Returns:
        The same instant, with ``tzinfo`` UTC.
    """
    if timezone.is_aware(value):
        return value.astimezone(dt.UTC)
    if connection.vendor == "postgresql":
        return aware(value)
    return value.replace(tzinfo=dt.UTC)


def utc_from_naive(value: dt.datetime) -> dt.datetime:
    """A naive UTC datetime (from SQL ``... AT TIME ZONE 'UTC'``) made aware."""
    return value.replace(tzinfo=dt.UTC)


def store_now(connection: BaseDatabaseWrapper) -> dt.datetime:
    """Now by the store's clock (this module), timezone-aware UTC."""
    if connection.vendor != "postgresql":
        return app_now()
    with connection.cursor() as cursor:
        # Read as UTC in SQL: exact whatever the session's time zone (USE_TZ = False
        # sets it to TIME_ZONE, and Django then strips the offset).
        cursor.execute(
            "SELECT (statement_timestamp() + %s * interval '1 second') AT TIME ZONE 'UTC'",
            [offset()],
        )
        (now,) = cursor.fetchone()
    return utc_from_naive(now)
