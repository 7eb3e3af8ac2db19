"""Migration 0003 on PostgreSQL: plain table -> partitioned and back, and the opt-out.

Also runs the store and the sweeper on a plain PostgreSQL table (a project that opted
out of partitioning), so both table kinds stay tested.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.models import Max
from django.test import override_settings

from django_idempotency import retention, store, testing
from django_idempotency.models import IdempotencyRecord
from django_idempotency.retention import partitions
from django_idempotency.store.schema import forget, is_partitioned
from tests.concurrency import Runner

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

APP = "django_idempotency"
BEFORE = "0002_outbox"
DAY = 86400.0
FP, OTHER_FP = "a" * 64, "b" * 64


def migrate(target: str) -> None:
    call_command("migrate", APP, target, verbosity=0)
    forget()


def latest() -> str:
    (leaf,) = [name for app, name in MigrationLoader(connection).graph.leaf_nodes() if app == APP]
    return leaf


def to_plain() -> None:
    """Switch the test database to the plain table at the latest schema."""
    migrate(BEFORE)
    with override_settings(IDEMPOTENCY={"PARTITION_RECORDS": False}):
        migrate(latest())


def to_partitioned() -> None:
    migrate(BEFORE)
    migrate(latest())


@pytest.fixture
def plain_table():
    to_plain()
    try:
        yield
    finally:
        migrate(BEFORE)  # whatever the test left, end on the default partitioned table
        migrate(latest())


def scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))


def claim(sc, fp=FP, *, lease=30.0, retention_s=3 * DAY):
    return store.claim(sc, fp, lease=lease, retention=retention_s)


def done(won, body=b"{}"):
    with transaction.atomic():
        store.complete(won, store.StoredResponse(201, [], body))


def has_scope_constraint() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_constraint WHERE conname = "
            "'django_idempotency_record_scope_uniq' AND contype = 'u'"
        )
        return cursor.fetchone()[0] == 1


def test_upgrade_from_the_plain_table_keeps_rows_and_claims(plain_table):
    assert not is_partitioned(connection) and has_scope_constraint()
    completed = scope()
    done(claim(completed), b"kept")
    in_flight = scope()
    flight = claim(in_flight, lease=30)
    reused = scope()
    done(claim(reused, retention_s=DAY))
    with testing.travel(2 * DAY):  # plain table: the expired row is rewritten in place
        future = claim(reused, OTHER_FP, retention_s=DAY)
    assert isinstance(future, store.Claim)
    with testing.travel(-20 * DAY):
        ancient = claim(scope())  # long past its window: copied, then swept
    count = IdempotencyRecord.objects.count()
    max_id = IdempotencyRecord.objects.aggregate(m=Max("id"))["m"]

    to_partitioned()

    assert is_partitioned(connection) and not has_scope_constraint()
    assert IdempotencyRecord.objects.count() == count
    retention.sweep()
    assert not IdempotencyRecord.objects.filter(pk=ancient.record_id).exists()
    assert IdempotencyRecord.objects.count() == count - 1
    replay = claim(completed)
    assert isinstance(replay, store.Existing) and replay.response.body == b"kept"
    assert isinstance(claim(in_flight), store.Existing)
    with testing.travel(31):
        taken = claim(in_flight)
    assert isinstance(taken, store.Claim) and taken.record_id == flight.record_id
    assert IdempotencyRecord.objects.get(pk=future.record_id).fingerprint == OTHER_FP
    assert claim(scope()).record_id > max_id
    rows = set(IdempotencyRecord.objects.values_list("pk", "key", "state", "fingerprint"))

    to_plain()  # and back

    assert not is_partitioned(connection) and has_scope_constraint()
    assert set(IdempotencyRecord.objects.values_list("pk", "key", "state", "fingerprint")) == rows
    replay = claim(completed)
    assert isinstance(replay, store.Existing) and replay.response.body == b"kept"
    assert claim(scope()).record_id > max_id


def test_partition_records_false_keeps_the_plain_table(plain_table):
    assert not is_partitioned(connection) and has_scope_constraint()
    assert partitions.list_partitions(connection) == []
    for _ in range(5):  # a race: several rounds
        sc = scope()
        barrier = threading.Barrier(8)
        runner = Runner()

        def contender():
            barrier.wait(10)
            return claim(sc)

        for _ in range(8):
            runner.start(contender)
        winners = [r for r in runner.join() if isinstance(r, store.Claim)]
        assert len(winners) == 1
        assert IdempotencyRecord.objects.get(key=sc.key).owner_token == winners[0].owner_token


def test_sweep_on_a_plain_postgres_table_deletes_in_batches(plain_table):
    with testing.travel(-10 * DAY):
        old = [claim(scope()) for _ in range(7)]
    recent = claim(scope())
    with override_settings(IDEMPOTENCY={"SWEEP_BATCH_SIZE": 3}):
        dry = retention.sweep(dry_run=True)
        assert (dry.method, dry.deleted_records) == ("delete", 7)
        assert IdempotencyRecord.objects.count() == 8
        report = retention.sweep()
    assert report.deleted_records == 7 and report.dropped == []
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [recent.record_id]
    assert not IdempotencyRecord.objects.filter(pk__in=[c.record_id for c in old]).exists()
    assert retention.sweep().deleted_records == 0


def test_plain_postgres_reuse_and_takeover(plain_table):
    sc = scope()
    first = claim(sc, lease=30, retention_s=DAY)
    with testing.travel(31):
        second = claim(sc, lease=30, retention_s=DAY)
    assert isinstance(second, store.Claim) and second.taken_over
    done(second)
    with testing.travel(DAY + 60):
        fresh = claim(sc, OTHER_FP, retention_s=DAY)
    # Past its window the key is new: a new row (a new generation), as on the
    # partitioned table.
    assert isinstance(fresh, store.Claim) and fresh.record_id != first.record_id
    assert IdempotencyRecord.objects.filter(key=sc.key).count() == 1


def test_back_to_the_plain_table_keeps_the_newer_of_two_rows_of_one_scope():
    """Should the partitioned table hold two rows of one scope (one past its window left
    behind), going back to the plain table keeps the newer: the record that stands."""
    assert is_partitioned(connection)
    sc = scope()
    with testing.travel(-2 * DAY):
        done(claim(sc, retention_s=DAY), b"old")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")  # no scope trigger
        cursor.execute(
            "INSERT INTO django_idempotency_record (principal, endpoint, key, fingerprint, "
            "state, owner_token, lease_until, recovery_point, response_headers, created_at, "
            "expires_at, sweep_after) SELECT principal, endpoint, key, %s, 'claimed', "
            "gen_random_uuid(), now() + interval '30 seconds', '', '[]'::jsonb, now(), "
            "now() + interval '1 day', now() + interval '1 day' "
            "FROM django_idempotency_record WHERE key = %s",
            [OTHER_FP, sc.key],
        )
    assert IdempotencyRecord.objects.filter(key=sc.key).count() == 2
    try:
        to_plain()
        (kept,) = IdempotencyRecord.objects.filter(key=sc.key)
        assert kept.fingerprint == OTHER_FP and kept.state == "claimed"
    finally:
        to_partitioned()
