"""The clock the relay and the store read."""

from __future__ import annotations

import datetime as dt

from django.db import connection

from django_idempotency.store import clock


def db_now() -> dt.datetime:
    """The relay's clock: the database's (with the test offset) on PostgreSQL."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT statement_timestamp() + %s * interval '1 second'", [clock.offset()]
            )
            return cursor.fetchone()[0]
    return clock.app_now()
