"""The record table on PostgreSQL: the migration's choice of kind, and the conversions.

The initial migration partitions the record table by day unless ``PARTITION_RECORDS``
is ``False`` when it runs; ``store.schema.tables`` converts an existing table either
way, keeping its rows.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Max
from django.test import override_settings

from django_idempotency import retention, store, testing
from django_idempotency.models import IdempotencyRecord
from django_idempotency.retention import partitions
from django_idempotency.store import clock
from django_idempotency.store.catalog import forget, is_partitioned
from django_idempotency.store.schema import tables
from tests.conftest import MIGRATED_PARTITIONS
from tests.support.concurrency import Runner

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

APP = "django_idempotency"
DAY = 86400.0
FP, OTHER_FP = "a" * 64, "b" * 64


def migrate_afresh(**idempotency: object) -> None:
    """Unapply and apply the app's migrations, with these ``IDEMPOTENCY`` settings."""
    call_command("migrate", APP, "zero", verbosity=0)
    with override_settings(IDEMPOTENCY=idempotency):
        call_command("migrate", APP, verbosity=0)
    forget()


@pytest.fixture
def plain_table():
    migrate_afresh(PARTITION_RECORDS=False)
    try:
        yield
    finally:
        migrate_afresh()  # whatever the test left, end on the default partitioned table


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


def to_partitioned() -> None:
    today = clock.store_now(connection).date()
    with transaction.atomic():
        tables.to_partitioned(
            connection,
            keep_since=None,
            days=[today + dt.timedelta(days=n) for n in range(tables.days_ahead() + 1)],
        )


def to_plain() -> None:
    with connection.schema_editor() as editor:
        tables.to_plain(connection, editor, IdempotencyRecord)


def test_the_migration_partitions_the_table_by_default():
    """On PostgreSQL 14+ the record table is partitioned, with the days a claim needs
    (as ``migrate`` made them, before any test's sweep)."""
    assert is_partitioned(connection) and not has_scope_constraint()
    today = clock.store_now(connection).date()
    wanted = {partitions.partition_name(today + dt.timedelta(days=n)) for n in range(2)}
    assert wanted <= MIGRATED_PARTITIONS


def test_partition_records_false_keeps_the_plain_table(plain_table):
    """The opt-out: a unique constraint decides, and one of concurrent first claims wins."""
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


def test_converting_a_table_either_way_keeps_its_rows_and_claims(plain_table):
    """Plain to partitioned and back: every row is kept, replays and takeovers still work,
    and a record long past its window is left for the sweeper."""
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

    to_plain()

    assert not is_partitioned(connection) and has_scope_constraint()
    assert set(IdempotencyRecord.objects.values_list("pk", "key", "state", "fingerprint")) == rows
    replay = claim(completed)
    assert isinstance(replay, store.Existing) and replay.response.body == b"kept"
    assert claim(scope()).record_id > max_id


def test_the_plain_table_reuses_past_their_window_and_takes_over(plain_table):
    """A key past its window is a new record (a new generation), as on partitions."""
    sc = scope()
    first = claim(sc, lease=30, retention_s=DAY)
    with testing.travel(31):
        second = claim(sc, lease=30, retention_s=DAY)
    assert isinstance(second, store.Claim) and second.taken_over
    done(second)
    with testing.travel(DAY + 60):
        fresh = claim(sc, OTHER_FP, retention_s=DAY)
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
        migrate_afresh()


def test_the_migration_unapplies_cleanly():
    """Migrating to zero drops the tables and every function; migrating again restores them."""
    call_command("migrate", APP, "zero", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'django_idempotency%%'")
            assert cursor.fetchall() == []
            cursor.execute("SELECT to_regclass('django_idempotency_record')")
            assert cursor.fetchone() == (None,)
    finally:
        call_command("migrate", APP, verbosity=0)
        forget()
    assert is_partitioned(connection)


# --- storage parameters: room on each page for the completion ---------------------------


def fillfactors() -> dict[str, str | None]:
    """The ``fillfactor`` of the record table and of each of its partitions, by name."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, (SELECT o FROM unnest(reloptions) o WHERE o LIKE 'fillfactor=%%') "
            "FROM pg_class WHERE relkind = 'r' AND relname LIKE 'django\\_idempotency\\_record%%'"
        )
        return dict(cursor.fetchall())


def page_of(record_id: int) -> int:
    """The heap page holding the current version of the record's row."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (ctid::text::point)[0]::bigint FROM django_idempotency_record WHERE id = %s",
            [record_id],
        )
        return int(cursor.fetchone()[0])


def test_the_record_tables_keep_a_quarter_of_each_page_free(plain_table):
    """The plain table, and every partition the migration creates, have ``fillfactor=75``."""
    assert fillfactors() == {"django_idempotency_record": "fillfactor=75"}
    migrate_afresh()
    found = fillfactors()
    assert len(found) > tables.days_ahead() and set(found.values()) == {"fillfactor=75"}


def test_a_completion_on_a_page_filled_by_later_claims_is_a_hot_update(record_table):
    """Claims go on filling the page of a claimed row until only the reserved quarter is
    left; the completion then writes the row's new version, with a 1.5 KB response, on
    the same page as a HOT update: no new entry in any index of the table."""
    first = claim(scope())
    page = page_of(first.record_id)
    for _ in range(500):
        if page_of(claim(scope()).record_id) != page:
            break  # the page took all the claims it will take
    else:
        pytest.fail("500 claims did not fill one page")
    with transaction.atomic():
        store.complete(first, store.StoredResponse(201, [], uuid.uuid4().hex.encode() * 47))
        with connection.cursor() as cursor:  # this transaction's own counts, not flushed yet
            cursor.execute(
                "SELECT sum(n_tup_upd), sum(n_tup_hot_upd) FROM pg_stat_xact_user_tables "
                "WHERE relname LIKE 'django\\_idempotency\\_record%%'"
            )
            updated, hot = cursor.fetchone()
    assert (updated, hot) == (1, 1)
    assert page_of(first.record_id) == page
