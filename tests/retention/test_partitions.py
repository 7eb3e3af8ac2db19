"""The day-partitioned record table on PostgreSQL (docs/retention.md).

Uniqueness of (principal, endpoint, key) across partitions (the default partition
included), claims straddling midnight with real concurrent connections, the protocol's
updates on the partitioned table, claims of a day without a partition (the default
partition, no DDL), and partition management by the sweeper. Time moves with ``testing.travel``
(or an explicit per-thread clock offset passed to the claim function). No fixed sleeps:
one test polls ``pg_locks``, with a deadline, until a claim waits for its lock.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency import exceptions, retention, store, testing
from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.retention import partitions, sweeper
from django_idempotency.store import clock
from django_idempotency.store.catalog import forget, is_partitioned
from django_idempotency.store.schema.functions import DEFAULT_PARTITION, SWEEP_LOCK
from django_idempotency.store.sql import PG_PARTITIONED_CLAIM_SQL
from tests.support.concurrency import Runner
from tests.support.factories import IdempotencyRecordFactory, partition_of

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DAY = 86400.0
FP = "a" * 64
OTHER_FP = "b" * 64
CLIENTS = 16


def scope(key: str | None = None) -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", key or str(uuid.uuid4()))


def claim(sc: store.Scope, fp: str = FP, *, lease: float = 30, retention_s: float = 3 * DAY):
    return store.claim(sc, fp, lease=lease, retention=retention_s)


def done(won: store.Claim, body: bytes = b"{}") -> None:
    with transaction.atomic():
        store.complete(won, store.StoredResponse(201, [], body))


def db_now() -> dt.datetime:
    return clock.store_now(connection)


def to_midnight() -> float:
    """Seconds from now (store clock) to the next UTC midnight."""
    now = db_now()
    midnight = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight - now).total_seconds()


def raw_claim(sc: store.Scope, fp: str, offset: float, *, lease: float = 30) -> dict:
    """The partitioned claim statement with this thread's own clock offset (seconds)."""
    params = {
        "principal": sc.principal,
        "endpoint": sc.endpoint,
        "key": sc.key,
        "fingerprint": fp,
        "token": uuid.uuid4(),
        "lease": lease,
        "retention": 3 * DAY,
        "clock_offset": offset,
        "take": False,  # no presence lock: these claims are read, never completed
        "test": True,
        "request_path": "/jobs",
    }
    with connection.cursor() as cursor:
        cursor.execute(PG_PARTITIONED_CLAIM_SQL, params)
        row = cursor.fetchone()
        return dict(zip([c.name for c in cursor.description], row, strict=True)) if row else {}


def day_of(offset: float = 0.0) -> dt.date:
    return (db_now() + dt.timedelta(seconds=offset)).date()


def window_day(offset: float = 0.0) -> dt.date:
    """The partition of a record claimed ``offset`` seconds from now: its window's end."""
    return day_of(offset + 3 * DAY)


# --- the table ---------------------------------------------------------------------


def test_the_table_is_range_partitioned_by_day_with_a_default_partition():
    assert is_partitioned(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.partstrat, p.partdefid::regclass::text, a.attname "
            "FROM pg_partitioned_table p "
            "JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] "
            "WHERE p.partrelid = 'django_idempotency_record'::regclass"
        )
        assert cursor.fetchone() == ("r", DEFAULT_PARTITION, "sweep_after")
    retention.sweep()
    days = {p.day for p in partitions.list_partitions(connection) if p.attached}
    today = day_of()
    assert {today + dt.timedelta(days=n) for n in range(conf.partitions_ahead + 1)} <= days


def test_rows_go_to_the_partition_of_their_day():
    won = claim(scope())
    assert partition_of(won.record_id) == partitions.partition_name(window_day())


def partition_names() -> set[str]:
    return {p.name for p in partitions.list_partitions(connection)}


def test_a_claim_of_a_day_without_a_partition_lands_in_the_default_partition():
    """No claim creates a partition: the record waits in the default partition, stays
    claimable and unique there, and the day's creation moves it into its day."""
    far = 400 * DAY
    day = window_day(far)
    name = partitions.partition_name(day)
    before = partition_names()
    assert name not in before
    try:
        with testing.travel(far):
            sc = scope()
            won = claim(sc)
            assert isinstance(won, store.Claim)
            assert partition_of(won.record_id) == DEFAULT_PARTITION
            assert partition_names() == before  # no DDL
            done(won, b"in default")
            again = claim(sc)
            assert isinstance(again, store.Existing) and again.response.body == b"in default"
        assert partitions.ensure(connection, day) == 1
        assert partition_of(won.record_id) == name
        assert partitions.ensure(connection, day) is None
        with testing.travel(far):
            replay = claim(sc)
        assert isinstance(replay, store.Existing) and replay.response.body == b"in default"
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {name}")


def storage_parameters(name: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", [name])
        return sorted(cursor.fetchone()[0] or [])


def test_a_new_partition_takes_the_storage_parameters_of_the_newest_one():
    """A new partition gets ``fillfactor=75``; once an operator sets storage parameters
    on the newest partition, the partitions made after it take them."""
    made: list[str] = []
    try:
        for days in (2000, 2001, 2002):  # later than any day another test makes
            day = window_day(days * DAY)
            assert partitions.ensure(connection, day) == 0
            made.append(partitions.partition_name(day))
            if days == 2000:
                assert storage_parameters(made[0]) == ["fillfactor=75"]
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"ALTER TABLE {made[0]} "
                        "SET (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01)"
                    )
            elif days == 2001:
                assert storage_parameters(made[1]) == [
                    "autovacuum_vacuum_scale_factor=0.01",
                    "fillfactor=90",
                ]
                with connection.cursor() as cursor:
                    cursor.execute(f"ALTER TABLE {made[1]} RESET (fillfactor)")
        assert storage_parameters(made[2]) == [
            "autovacuum_vacuum_scale_factor=0.01",
            "fillfactor=75",
        ]
    finally:
        with connection.cursor() as cursor:
            for name in made:
                cursor.execute(f"DROP TABLE IF EXISTS {name}")


def test_a_day_waits_for_a_transaction_using_the_table_and_its_claims_still_succeed():
    """A day is created under the table's ACCESS EXCLUSIVE lock: while a transaction
    uses the table the creation gives up at its ``lock_timeout`` (the sweeper tries
    again next run), and that transaction's claims of the day land in the default
    partition meanwhile."""
    far = 2100 * DAY  # later than any day another test makes
    day = window_day(far)
    name = partitions.partition_name(day)
    runner = Runner()
    try:
        with transaction.atomic():
            assert isinstance(claim(scope()), store.Claim)
            runner.start(lambda: partitions.ensure(connections["default"], day, lock_timeout=0.2))
            with pytest.raises(OperationalError):
                runner.join()
            with testing.travel(far):
                won = claim(scope())
            assert isinstance(won, store.Claim)
            assert partition_of(won.record_id) == DEFAULT_PARTITION
        assert partitions.ensure(connection, day) == 1
        assert partition_of(won.record_id) == name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {name}")


def test_concurrent_claims_of_a_day_without_a_partition_all_succeed_without_ddl():
    """Sixteen different keys on a day without a partition, each from a session that
    connects during the race: all are claimed, in the default partition, and no
    partition is created."""
    offset = 500 * DAY + 3600
    barrier = threading.Barrier(CLIENTS)
    runner = Runner()
    before = partition_names()

    def contender():
        barrier.wait(10)
        return claim(scope())  # the thread's first statement: a new session

    with testing.travel(offset):
        for _ in range(CLIENTS):
            runner.start(contender)
        results = runner.join()
    assert all(isinstance(r, store.Claim) for r in results), results
    assert {partition_of(r.record_id) for r in results} == {DEFAULT_PARTITION}
    assert partition_names() == before


def test_a_day_created_while_its_claims_run_leaves_every_claim_succeeded_once():
    """A sweeper creates a day while sixteen sessions claim keys of that day, each key
    twice: every claim succeeds or finds its own key's record, each scope is stored
    once, and every record ends in the day's partition (moved, or inserted after)."""
    far = 2200 * DAY  # later than any day another test makes
    day = window_day(far)
    name = partitions.partition_name(day)
    scopes = [scope() for _ in range(CLIENTS // 2)]
    barrier = threading.Barrier(CLIENTS + 1)
    runner = Runner()

    def contender(sc):
        barrier.wait(10)
        return sc.key, claim(sc)

    def creator():
        barrier.wait(10)
        return partitions.ensure(connections["default"], day, lock_timeout=10)

    try:
        with testing.travel(far):
            for sc in scopes * 2:  # each scope claimed twice
                runner.start(lambda sc=sc: contender(sc))
            runner.start(creator)
            results = runner.join()
        moved = [r for r in results if not isinstance(r, tuple)]
        claims = [r for r in results if isinstance(r, tuple)]
        assert len(moved) == 1 and moved[0] is not None
        won = [key for key, r in claims if isinstance(r, store.Claim)]
        assert sorted(won) == sorted(sc.key for sc in scopes)  # each scope won once
        assert sum(isinstance(r, store.Existing) for _, r in claims) == len(scopes)
        keys = [sc.key for sc in scopes]
        rows = IdempotencyRecord.objects.filter(key__in=keys)
        assert sorted(r.key for r in rows) == sorted(keys)
        assert {partition_of(r.pk) for r in rows} == {name}
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {name}")


def test_claim_is_one_round_trip():
    sc = scope()
    claim(scope())  # the table kind is now known on this connection
    with CaptureQueriesContext(connection) as first:
        won = claim(sc)
    done(won)
    with CaptureQueriesContext(connection) as replay:
        existing = claim(sc)
    assert isinstance(existing, store.Existing) and existing.completed
    assert len(first) == 1 and "django_idempotency_claim" in first[0]["sql"]
    assert len(replay) == 1


def test_the_table_kind_is_asked_once_per_connection():
    forget()
    with CaptureQueriesContext(connection) as queries:
        claim(scope())
        claim(scope())
    assert [q["sql"].count("pg_class") for q in queries] == [1, 0, 0]


# --- uniqueness across partitions ----------------------------------------------------


def test_a_key_claimed_on_day_d_replays_on_day_d_plus_1():
    sc = scope()
    won = claim(sc)
    done(won, b'{"id": 7}')
    with testing.travel(DAY + 60):
        again = claim(sc)
    assert isinstance(again, store.Existing) and again.completed
    assert again.response.body == b'{"id": 7}'
    assert IdempotencyRecord.objects.filter(key=sc.key).count() == 1


def test_a_claim_in_flight_on_day_d_blocks_its_duplicate_on_day_d_plus_1():
    sc = scope()
    with testing.travel(to_midnight() - 5):
        claim(sc, lease=60)
    with testing.travel(to_midnight() + 5):
        existing = claim(sc, lease=60)
    assert isinstance(existing, store.Existing) and existing.lease_remaining > 0


def test_concurrent_claims_straddling_midnight_execute_once(request):
    """Half the contenders' clocks read 23:59:30, half 00:00:30, all at once."""
    rounds = 50 if request.config.getoption("--stress") else 5
    for _ in range(rounds):
        sc = scope()
        midnight = to_midnight()
        offsets = [midnight - 30 if n % 2 else midnight + 30 for n in range(CLIENTS)]
        # The two days' partitions exist before the contenders connect: what this test
        # is about is the scope's lock across midnight, not making partitions.
        for offset in set(offsets):
            partitions.ensure(connection, window_day(offset))
        barrier = threading.Barrier(CLIENTS)
        runner = Runner()
        for offset in offsets:

            def contender(offset=offset):
                barrier.wait(10)
                return raw_claim(sc, FP, offset)

            runner.start(contender)
        results = runner.join()
        assert sum(bool(r.get("won")) for r in results) == 1
        assert IdempotencyRecord.objects.filter(key=sc.key).count() == 1
        winner = next(r for r in results if r.get("won"))
        losers = [r for r in results if r and not r["won"]]
        assert all(r["id"] == winner["id"] for r in losers)


def test_a_claim_held_before_midnight_makes_the_one_after_midnight_wait():
    """The scope's advisory lock: the later claim waits, then sees the committed row."""
    sc = scope()
    midnight = to_midnight()
    held, release = threading.Event(), threading.Event()
    first, second = Runner(), Runner()

    def before_midnight():
        with transaction.atomic():
            row = raw_claim(sc, FP, midnight - 30)
            held.set()
            assert release.wait(30)
        return row

    first.start(before_midnight)
    assert held.wait(30)
    second.start(lambda: raw_claim(sc, FP, midnight + 30))
    assert _wait_for_advisory_lock_waiter()
    release.set()
    (row1,), (row2,) = first.join(), second.join()
    assert row1["won"] and not row2["won"] and row2["id"] == row1["id"]
    assert partition_of(row1["id"]) == partitions.partition_name(window_day(midnight - 30))


def _wait_for_advisory_lock_waiter() -> bool:
    """Poll pg_locks (with a bound) until a backend waits on an advisory lock."""
    deadline = threading.Event()
    timer = threading.Timer(30, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                )
                if cursor.fetchone()[0]:
                    return True
            deadline.wait(0.01)
        return False
    finally:
        timer.cancel()


def test_a_key_in_the_default_partition_is_unique_across_the_day_partitions():
    """A record in the default partition and a claim or insert of its scope whose
    window ends in a day partition: one record per scope, the duplicate is refused."""
    far = 2300 * DAY  # later than any day another test makes
    sc = scope()
    with testing.travel(far):
        won = claim(sc)
    assert partition_of(won.record_id) == DEFAULT_PARTITION
    existing = claim(sc)  # its window ends in a day partition; the record is not there
    assert isinstance(existing, store.Existing) and existing.lease_remaining > 0
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecordFactory(principal=sc.principal, endpoint=sc.endpoint, key=sc.key)
    assert IdempotencyRecord.objects.filter(key=sc.key).count() == 1


def test_direct_inserts_of_a_duplicate_scope_are_refused_across_partitions():
    record = IdempotencyRecordFactory()
    later = record.created_at + dt.timedelta(days=2)
    with testing.travel(2 * DAY):
        claim(scope())  # makes sure that day's partition exists
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecordFactory(key=record.key, created_at=later)
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecord.objects.filter(pk=IdempotencyRecordFactory().pk).update(key=record.key)
    IdempotencyRecordFactory(key=record.key, principal="auth.user:2")  # another scope


def test_concurrent_direct_inserts_of_one_scope_one_wins():
    key = str(uuid.uuid4())
    now = db_now()
    barrier = threading.Barrier(CLIENTS)
    runner = Runner()

    def inserter(n):
        barrier.wait(10)
        try:
            IdempotencyRecordFactory(key=key, created_at=now + dt.timedelta(hours=n))
            return True
        except IntegrityError:
            return False

    for n in range(CLIENTS):
        runner.start(lambda n=n: inserter(n))
    assert sorted(runner.join()) == [False] * (CLIENTS - 1) + [True]


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_claims_outside_read_committed_are_refused(level):
    """A snapshot older than the lock could miss the row it must see."""
    from django.db import NotSupportedError

    with pytest.raises(NotSupportedError, match="READ COMMITTED"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        raw_claim(scope(), FP, 0)
    with pytest.raises(NotSupportedError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        IdempotencyRecordFactory()


# --- the protocol's updates on the partitioned table ----------------------------------


def test_takeover_across_midnight_keeps_the_row_in_its_day():
    sc = scope()
    midnight = to_midnight()
    with testing.travel(midnight - 5):
        first = claim(sc, lease=30)
    with testing.travel(midnight + 60):
        second = claim(sc, lease=30)
        assert isinstance(second, store.Claim) and second.taken_over
        with pytest.raises(exceptions.LeaseLost):
            done(first)  # the stale owner is fenced
        done(second, b"second")
    assert second.record_id == first.record_id
    assert partition_of(second.record_id) == partitions.partition_name(window_day(midnight - 5))
    record = IdempotencyRecord.objects.get(key=sc.key)
    assert record.state == RecordState.COMPLETED and bytes(record.response_body) == b"second"


def test_heartbeat_and_release_on_the_partitioned_table():
    sc = scope()
    won = claim(sc, lease=30)
    assert store.extend(won, 600)
    with testing.travel(300):
        assert isinstance(claim(sc), store.Existing)
    assert store.release(won)
    assert not IdempotencyRecord.objects.filter(key=sc.key).exists()


def test_past_retention_a_fresh_row_replaces_the_old_one_in_todays_partition():
    sc = scope()
    won = claim(sc, retention_s=DAY)
    done(won, b"old")
    with testing.travel(2 * DAY + 60):
        fresh = claim(sc, OTHER_FP, retention_s=DAY)
        assert isinstance(fresh, store.Claim) and not fresh.taken_over
        new_day = partitions.partition_name(day_of(DAY))  # where its new window ends
    assert fresh.record_id != won.record_id
    record = IdempotencyRecord.objects.get(key=sc.key)
    assert record.pk == fresh.record_id and record.fingerprint == OTHER_FP
    assert partition_of(record.pk) == new_day


def test_concurrent_reuse_across_days_has_one_winner():
    sc = scope()
    done(claim(sc, retention_s=DAY))
    barrier = threading.Barrier(CLIENTS)
    runner = Runner()

    def contender():
        barrier.wait(10)
        return claim(sc, OTHER_FP, retention_s=DAY)

    with testing.travel(3 * DAY):
        for _ in range(CLIENTS):
            runner.start(contender)
        results = runner.join()
    assert sum(isinstance(r, store.Claim) for r in results) == 1
    assert IdempotencyRecord.objects.filter(key=sc.key).count() == 1


def test_orm_updates_and_deletes_by_pk_work():
    won = claim(scope())
    record = IdempotencyRecord.objects.get(pk=won.record_id)
    record.recovery_point = "charged"
    record.save()
    assert IdempotencyRecord.objects.filter(pk=won.record_id).update(recovery_point="x") == 1
    assert IdempotencyRecord.objects.get(pk=won.record_id).recovery_point == "x"
    record.delete()
    assert not IdempotencyRecord.objects.filter(pk=won.record_id).exists()


# --- the sweeper on partitions ---------------------------------------------------------


def _old_and_new_records():
    partitions.ensure(connection, window_day(-10 * DAY))
    with testing.travel(-10 * DAY):
        old = claim(scope())
    recent = claim(scope())
    return old, recent


def test_sweep_drops_whole_days_past_max_retention_and_creates_days_ahead():
    old, recent = _old_and_new_records()
    old_name = partition_of(old.record_id)
    dry = retention.sweep(dry_run=True)
    assert dry.method == "partitions" and old_name in {p.name for p in dry.dropped}
    assert IdempotencyRecord.objects.filter(pk=old.record_id).exists()
    report = retention.sweep()
    assert old_name in {p.name for p in report.dropped} and not report.errors
    assert not IdempotencyRecord.objects.filter(pk=old.record_id).exists()
    assert IdempotencyRecord.objects.filter(pk=recent.record_id).exists()
    names = {p.name for p in partitions.list_partitions(connection)}
    assert old_name not in names
    assert all(p.day >= report.cutoff.date() for p in partitions.list_partitions(connection))
    again = retention.sweep()
    assert again.dropped == [] and again.created == []


def test_the_sweeper_moves_the_default_partitions_records_into_the_days_it_creates():
    """A day the sweeper had not created when its records were claimed: the sweep
    creates it and moves them there (``moved``)."""
    day = window_day()
    name = partitions.partition_name(day)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {name}")
    won = claim(scope())
    assert partition_of(won.record_id) == DEFAULT_PARTITION
    report = retention.sweep()
    assert day in report.created and report.moved == 1 and not report.errors
    assert partition_of(won.record_id) == name


def test_the_sweeper_deletes_the_default_partitions_records_past_their_window():
    """Records of a past day that never got its partition are deleted from the default
    partition once their window and lease are over (``deleted_records``); a record
    still in its window stays."""
    with testing.travel(-20 * DAY):  # a day no partition holds
        gone = claim(scope(), retention_s=60)
        done(gone)
    with testing.travel(2400 * DAY):  # a day no partition holds either
        kept = claim(scope())
        done(kept)  # completed, inside its window
    assert {partition_of(gone.record_id), partition_of(kept.record_id)} == {DEFAULT_PARTITION}
    assert retention.sweep(dry_run=True).deleted_records == 1
    report = retention.sweep()
    assert report.deleted_records == 1 and not report.errors
    assert not IdempotencyRecord.objects.filter(pk=gone.record_id).exists()
    assert IdempotencyRecord.objects.filter(pk=kept.record_id).exists()


def test_max_retention_never_shortens_a_window():
    """Lowering MAX_RETENTION in a deploy keeps every record for its own window."""
    with testing.travel(-3 * DAY):
        long_window = claim(scope(), retention_s=5 * DAY)
    with override_idempotency(MAX_RETENTION=DAY, RETENTION=3600):
        report = retention.sweep()
        assert IdempotencyRecord.objects.filter(pk=long_window.record_id).exists()
        with testing.travel(3 * DAY):
            retention.sweep()
    assert not IdempotencyRecord.objects.filter(pk=long_window.record_id).exists()
    assert not report.errors


def override_idempotency(**values):
    from django.test import override_settings

    return override_settings(IDEMPOTENCY=values)


def test_a_second_sweeper_is_a_no_op_while_one_holds_the_lock():
    old, _ = _old_and_new_records()
    other = connection.copy()
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", list(SWEEP_LOCK))
        report = retention.sweep()
        assert report.skipped and report.dropped == []
        assert IdempotencyRecord.objects.filter(pk=old.record_id).exists()
    finally:
        with other.cursor() as cursor:  # closing alone releases it only eventually
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", list(SWEEP_LOCK))
        other.close()
    assert not retention.sweep().skipped
    assert not IdempotencyRecord.objects.filter(pk=old.record_id).exists()


def test_two_sweepers_at_once_drop_each_partition_once():
    for days_back in (10, 11, 12):
        partitions.ensure(connection, window_day(-days_back * DAY))
        with testing.travel(-days_back * DAY):
            claim(scope())
    expected = {p.name for p in retention.sweep(dry_run=True).dropped}
    assert len(expected) >= 3
    barrier = threading.Barrier(2)
    runner = Runner()

    def sweeper():
        barrier.wait(10)
        return retention.sweep()

    runner.start(sweeper)
    runner.start(sweeper)
    reports = runner.join()
    dropped = [p.name for r in reports for p in r.dropped]
    assert sorted(dropped) == sorted(expected)  # each exactly once, by whoever ran
    assert not any(r.errors for r in reports)


def test_sweep_inside_a_transaction_drops_old_days():
    old, recent = _old_and_new_records()
    with transaction.atomic():
        report = retention.sweep()
    assert report.dropped and not IdempotencyRecord.objects.filter(pk=old.record_id).exists()
    assert IdempotencyRecord.objects.filter(pk=recent.record_id).exists()


def test_a_day_table_left_unattached_is_dropped():
    old, _ = _old_and_new_records()
    name = partition_of(old.record_id)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE django_idempotency_record DETACH PARTITION {name}")
    leftovers = [p for p in partitions.list_partitions(connection) if not p.attached]
    assert [p.name for p in leftovers] == [name]
    assert name in {p.name for p in retention.sweep().dropped}
    assert name not in {p.name for p in partitions.list_partitions(connection)}


def test_a_partition_drop_that_cannot_get_its_lock_is_reported_and_retried(monkeypatch):
    old, _ = _old_and_new_records()
    name = partition_of(old.record_id)
    monkeypatch.setattr(sweeper, "LOCK_TIMEOUT", 0.2)
    reader = connection.copy()
    try:
        reader.set_autocommit(False)
        with reader.cursor() as cursor:  # an open transaction that read the old day
            cursor.execute(f"LOCK TABLE {name} IN ACCESS SHARE MODE")
        report = retention.sweep()
        assert name in [e.split(":")[0] for e in report.errors]
        assert name not in {p.name for p in report.dropped}
    finally:
        reader.rollback()
        reader.close()
    assert name in {p.name for p in retention.sweep().dropped}
