"""The default partition and the creation of days (PostgreSQL, partitioned table).

A claim only inserts: a claim of a day without a partition lands in the default
partition, sends no DDL and takes no lock another claim waits for. A day is created
under the record table's ACCESS EXCLUSIVE lock, so a session that read the table's
partitions before sees the new day at its next statement: its claims go there, and its
lookups find the records moved there. Real sessions in threads; barriers and events,
no sleeps.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency import store, testing
from django_idempotency.retention import partitions
from django_idempotency.store import clock
from django_idempotency.store.catalog import is_partitioned
from django_idempotency.store.schema import tables
from django_idempotency.store.schema.functions import DEFAULT_PARTITION
from tests.support.concurrency import Runner
from tests.support.factories import partition_of

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DAY = 86400.0
FP = "d" * 64


@pytest.fixture(autouse=True)
def _partitioned() -> None:
    if not is_partitioned(connection):
        pytest.skip("partitioned table only")


def scope(key: str | None = None) -> store.Scope:
    return store.Scope("auth.user:3", "POST /days", key or str(uuid.uuid4()))


def claim(sc: store.Scope) -> store.Claim | store.Existing:
    return store.claim(sc, FP, lease=30, retention=DAY)


def window_day(offset: float) -> dt.date:
    """The day a claim made ``offset`` seconds from now ends its window in."""
    return (clock.store_now(connection) + dt.timedelta(seconds=offset + DAY)).date()


def partition_tables() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'django\\_idempotency\\_record\\_%'"
        )
        return {name for (name,) in cursor.fetchall()}


def drop_day(day: dt.date) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {partitions.partition_name(day)}")


def test_a_claim_of_a_day_without_a_partition_is_one_statement_and_no_ddl():
    """One round trip, no table created, and no lock on the record table stronger than
    ROW EXCLUSIVE (which no other claim waits for)."""
    far = 3000 * DAY  # a day no partition holds
    before = partition_tables()
    claim(scope())  # the table kind is now known on this connection
    with testing.travel(far), transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            won = claim(scope())
        assert isinstance(won, store.Claim)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT DISTINCT l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'django\\_idempotency\\_record%'"
            )
            modes = {mode for (mode,) in cursor.fetchall()}
    sent = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(sent) == 1 and "django_idempotency_claim" in sent[0]
    assert partition_of(won.record_id) == DEFAULT_PARTITION
    assert modes <= {"AccessShareLock", "RowExclusiveLock"}, modes
    assert partition_tables() == before


def test_a_session_that_read_the_partitions_before_a_day_was_made_sees_that_day():
    """A session claims (its map of partitions is read), then another creates a day
    and moves a record of that day out of the default partition. The first session's
    duplicate of that record finds it (no second record), and its new key of that day
    goes into the day's partition."""
    far = 3100 * DAY
    day = window_day(far)
    read, go = threading.Event(), threading.Event()
    moved = scope()
    runner = Runner()

    def session() -> tuple[object, object]:
        assert isinstance(claim(scope()), store.Claim)  # reads the partitions
        read.set()
        assert go.wait(30)
        return claim(moved), claim(scope())

    try:
        runner.start(session)
        assert read.wait(30)
        with testing.travel(far):
            first = claim(moved)
            assert partition_of(first.record_id) == DEFAULT_PARTITION
            assert partitions.ensure(connection, day) == 1
            go.set()
            ((duplicate, new),) = runner.join()
        assert isinstance(duplicate, store.Existing) and duplicate.lease_remaining > 0
        assert isinstance(new, store.Claim)
        assert partition_of(first.record_id) == partitions.partition_name(day)
        assert partition_of(new.record_id) == partitions.partition_name(day)
    finally:
        go.set()
        drop_day(day)


def test_two_creators_of_one_day_create_it_once():
    """Two sessions create one day at once: one creates it (moving the default
    partition's records of the day), the other finds it there (``None``)."""
    far = 3200 * DAY
    day = window_day(far)
    with testing.travel(far):
        won = claim(scope())
    barrier = threading.Barrier(2)
    runner = Runner()

    def creator() -> int | None:
        barrier.wait(10)
        return partitions.ensure(connections["default"], day, lock_timeout=30)

    try:
        runner.start(creator)
        runner.start(creator)
        assert sorted(runner.join(), key=str) == [1, None]
        assert partition_of(won.record_id) == partitions.partition_name(day)
    finally:
        drop_day(day)


def test_lock_table_gives_up_at_its_timeout_and_keeps_the_callers_setting():
    """``lock_table`` waits at most its ``lock_timeout``; once the lock is held, the
    caller's own ``lock_timeout`` is in force again."""
    holder = connection.copy()
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("LOCK TABLE django_idempotency_record IN ACCESS SHARE MODE")
        with pytest.raises(OperationalError), transaction.atomic(), connection.cursor() as cursor:
            tables.lock_table(cursor, 0.1)
    finally:
        holder.rollback()
        holder.close()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        tables.lock_table(cursor, 0.1)
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "7s"


def test_a_day_that_cannot_get_its_lock_leaves_the_callers_transaction_usable():
    """Inside a caller's transaction, a creation that times out is rolled back alone
    (its savepoint): the caller's transaction goes on and can commit."""
    far = 3300 * DAY
    day = window_day(far)
    holder = connection.copy()
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("LOCK TABLE django_idempotency_record IN ACCESS SHARE MODE")
        with transaction.atomic():
            with pytest.raises(OperationalError):
                partitions.ensure(connection, day, lock_timeout=0.1)
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                assert cursor.fetchone() == (1,)
    finally:
        holder.rollback()
        holder.close()
    assert partitions.partition_name(day) not in partition_tables()


def test_a_table_of_the_days_name_left_unattached_is_attached_with_the_days_records():
    """A table named like a day partition but not attached (an operator detached it):
    creating the day attaches it, with the records the default partition holds of that
    day moved into it beside its own."""
    far = 3400 * DAY
    day = window_day(far)
    name = partitions.partition_name(day)
    try:
        assert partitions.ensure(connection, day) == 0
        with testing.travel(far):
            kept = claim(scope())
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE django_idempotency_record DETACH PARTITION {name}")
        with testing.travel(far):
            waiting = claim(scope())
        assert partition_of(waiting.record_id) == DEFAULT_PARTITION
        assert partitions.ensure(connection, day) == 1
        assert partition_of(kept.record_id) == name
        assert partition_of(waiting.record_id) == name
    finally:
        drop_day(day)


def test_a_claim_in_flight_while_its_day_is_created_completes_and_replays():
    """A record claimed into the default partition, its day created (the record moved)
    before the view completes: the fenced completion finds it in its day, and a retry
    replays it."""
    far = 3500 * DAY
    day = window_day(far)
    sc = scope()
    try:
        with testing.travel(far):
            won = claim(sc)
            assert isinstance(won, store.Claim)
            assert partition_of(won.record_id) == DEFAULT_PARTITION
            assert partitions.ensure(connection, day) == 1
            with transaction.atomic():
                store.complete(won, store.StoredResponse(201, [], b'{"id": 5}'))
            again = claim(sc)
        assert isinstance(again, store.Existing) and again.response.body == b'{"id": 5}'
        assert partition_of(won.record_id) == partitions.partition_name(day)
    finally:
        drop_day(day)
