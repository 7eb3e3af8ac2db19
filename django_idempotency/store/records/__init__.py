"""The claim's store: what ``store.claims`` asks of a database (docs/concepts.md).

One small contract, :class:`RecordStore`, with one implementation per store kind, as
Django's session backends have: ``postgresql`` (one statement inserts a claim or
reports the record that holds the key, with whether its owner is gone; the
day-partitioned table through a server-side function) and ``portable`` (the ORM:
SQLite and the other backends). :func:`record_store` picks the one of a database. What
a record means for a request (replay, 422, 409, takeover, reuse) is decided once, by
``store.claims.judge``.
"""

from __future__ import annotations

from django.db import connections

from django_idempotency.store.records.base import RecordStore, taken_over
from django_idempotency.store.records.portable import PortableRecords
from django_idempotency.store.records.postgresql import PostgresRecords

__all__ = ["PortableRecords", "PostgresRecords", "RecordStore", "record_store", "taken_over"]


def record_store(using: str) -> RecordStore:
    """The record store of database ``using`` (an alias): PostgreSQL's, or the portable one."""
    if connections[using].vendor == "postgresql":
        return PostgresRecords(using)
    return PortableRecords(using)
