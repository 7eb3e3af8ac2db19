from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from django_idempotency.models import IdempotencyRecord, RecordState


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


class TokenFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Token

    user = factory.SubFactory(UserFactory)


class IdempotencyRecordFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = IdempotencyRecord

    principal = "auth.user:1"
    endpoint = "POST /widgets"
    key = factory.LazyFunction(lambda: str(uuid.uuid4()))
    fingerprint = factory.LazyFunction(lambda: hashlib.sha256(b"x").hexdigest())
    state = RecordState.CLAIMED
    created_at = factory.LazyFunction(timezone.now)
    lease_until = factory.LazyAttribute(lambda o: o.created_at + dt.timedelta(seconds=60))
    expires_at = factory.LazyAttribute(lambda o: o.created_at + dt.timedelta(days=1))


def partition_day(claim: Any) -> dt.date:
    """The UTC day of ``claim``'s record's partition key (``sweep_after``): its day partition."""
    sweep_after = IdempotencyRecord.objects.get(pk=claim.record_id).sweep_after
    assert sweep_after is not None
    return sweep_after.astimezone(dt.UTC).date()


def create_window_day(window: float) -> None:
    """On the partitioned table, create the day partition in which the window of a
    record claimed now (by the store's clock, travel included) ends, as the sweeper
    would have made it ahead: the record then goes to its day, not to the default
    partition. Outside a test's transaction (the creation takes the table's lock)."""
    from django.db import connection

    from django_idempotency.retention import partitions
    from django_idempotency.store import clock
    from django_idempotency.store.catalog import is_partitioned

    if is_partitioned(connection):
        end = clock.store_now(connection) + dt.timedelta(seconds=window)
        partitions.ensure(connection, end.date())


def partition_of(record_id: int) -> str:
    """The table (a day partition, or the default partition) that holds record ``record_id``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM django_idempotency_record WHERE id = %s",
            [record_id],
        )
        return cursor.fetchone()[0]
