"""The promise at its edges: retention by each record's own window, late completions,
timestamps taken after a wait, isolation levels, and takeovers that never wait on a
stalled original.

Every test runs on SQLite and on PostgreSQL with both record tables (day-partitioned and
plain: the ``record_table`` fixture), unless its mechanism exists on one backend only.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from django_idempotency import exceptions, retention, store, testing
from django_idempotency.models import IdempotencyRecord, OutboxMessage
from django_idempotency.retention import partitions, sweeper
from django_idempotency.store import clock
from django_idempotency.store.schema import tables
from tests.support.concurrency import Runner, token_client
from tests.support.factories import partition_day
from tests.support.testapp.gates import GATES, Gate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]

DAY = 86400.0
FP, OTHER_FP = "a" * 64, "b" * 64
APP = "django_idempotency"


def scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))


def claim(sc: store.Scope, fp: str = FP, *, lease: float = 30.0, retention_s: float = DAY):
    return store.claim(sc, fp, lease=lease, retention=retention_s)


def complete(won: store.Claim, body: bytes = b"{}") -> None:
    with transaction.atomic():
        store.complete(won, store.StoredResponse(201, [], body))


def exists(won: store.Claim) -> bool:
    return IdempotencyRecord.objects.filter(pk=won.record_id).exists()


def to_midnight() -> float:
    """Seconds from now (the store's clock) to the next midnight UTC."""
    now = clock.store_now(connection)
    return (sweeper.start_of_day(now) + dt.timedelta(days=1) - now).total_seconds()


# --- the sweeper never forgets a live record -----------------------------------------


def test_a_takeover_near_the_end_of_the_window_survives_the_sweep(record_table):
    """Claimed before midnight, taken over just before its window ends, swept while the
    new owner runs: the record, its recovery point and its lease all stand."""
    settings = {"RETENTION": DAY, "MAX_RETENTION": DAY}
    sc = scope()
    start = to_midnight() - 60
    with override_settings(IDEMPOTENCY=settings):
        with testing.travel(start):
            first = claim(sc, lease=600)
            assert isinstance(first, store.Claim)
            with transaction.atomic():
                store.advance(first, "allocated")
        with testing.travel(start + DAY - 30):
            second = claim(sc, lease=600)
        assert isinstance(second, store.Claim) and second.taken_over
        assert second.recovery_point == "allocated"
        with testing.travel(start + DAY + 300):  # the first window is over, the lease is not
            report = retention.sweep()
            assert exists(second) and not report.errors
            duplicate = claim(sc, lease=600)
        assert isinstance(duplicate, store.Existing) and duplicate.lease_remaining > 0
        assert duplicate.recovery_point == "allocated"
        with testing.travel(start + DAY + 400):
            complete(second, b"done")
        with testing.travel(start + DAY + 500):
            retention.sweep()
            replay = claim(sc, lease=600)
        assert isinstance(replay, store.Existing) and replay.response.body == b"done"


def test_a_view_window_longer_than_max_retention_is_honoured(record_table):
    sc = scope()
    complete(claim(sc, retention_s=14 * DAY), b"two weeks")  # MAX_RETENTION: 7 days
    for days in (8, 9, 13.9):
        with testing.travel(days * DAY):
            retention.sweep()
            again = claim(sc, retention_s=14 * DAY)
        assert isinstance(again, store.Existing) and again.response.body == b"two weeks"
    with testing.travel(16 * DAY):
        retention.sweep()
        assert IdempotencyRecord.objects.filter(key=sc.key).count() == 0


def test_lowering_max_retention_keeps_records_already_written(record_table):
    with testing.travel(-3 * DAY):
        won = claim(scope(), retention_s=7 * DAY)
        complete(won)
    with override_settings(IDEMPOTENCY={"MAX_RETENTION": DAY, "RETENTION": 3600}):
        retention.sweep()
    assert exists(won)


def test_storage_follows_each_records_own_window(record_table):
    """1 h, 24 h and 7 d records side by side: each is gone about a day after its own
    window, not after the longest one."""
    hour, day, week = (
        claim(scope(), retention_s=3600),
        claim(scope()),
        claim(scope(), retention_s=7 * DAY),
    )
    for won in (hour, day, week):
        complete(won)
    with testing.travel(2 * DAY + 60):
        report = retention.sweep()
    assert not exists(hour) and not exists(day) and exists(week)
    if record_table == "partitioned":
        assert report.dropped and not report.held
    with testing.travel(9 * DAY):
        retention.sweep()
    assert not exists(week)


def test_a_live_lease_holds_its_partition_past_its_day(record_table):
    """A heartbeat keeps a claim beyond its window; its day is kept (``held``), and a dry
    run says so too (it would keep the day, not drop it)."""
    sc = scope()
    won = claim(sc, lease=60, retention_s=60)
    with testing.travel(50):
        assert store.extend(won, 3 * DAY)
    with testing.travel(2 * DAY):
        dry = retention.sweep(dry_run=True)
        report = retention.sweep()
        assert exists(won)
        assert isinstance(claim(sc, retention_s=60), store.Existing)
    if record_table == "partitioned":
        assert report.held == [partitions.partition_name(partition_day(won))]
        assert dry.held == report.held and report.held[0] not in dry.dropped
    with testing.travel(3 * DAY + 120):
        retention.sweep()
    assert not exists(won)


# --- a late completion stays replayable ------------------------------------------------


def test_a_completion_after_the_window_stays_replayable(record_table):
    sc = scope()
    assert isinstance(claim(sc, lease=10, retention_s=60), store.Claim)
    with testing.travel(58):  # the lease is over, 2 s of the window are left
        taker = claim(sc, lease=10, retention_s=60)
    assert isinstance(taker, store.Claim) and taker.taken_over
    with testing.travel(63):  # completes 3 s after the window's end
        complete(taker, b"late")
    with testing.travel(70):  # the client's next retry
        retention.sweep()
        replay = claim(sc, lease=10, retention_s=60)
    assert isinstance(replay, store.Existing) and replay.response.body == b"late"
    with testing.travel(63 + 10 + 1):  # kept at least a lease after the completion
        assert isinstance(claim(sc, OTHER_FP, lease=10, retention_s=60), store.Claim)


# --- timestamps after the wait (PostgreSQL) -------------------------------------------


def _backend_pid(conn) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _wait_until_someone_waits_for(holder_pid: int) -> None:
    """Block until some backend waits for a lock that backend ``holder_pid`` holds (a
    bounded poll of pg_blocking_pids).

    The holder's pid is the one to watch: it has a transaction open, so it keeps its
    server connection even behind a transaction-pooling PgBouncer, where the waiter's
    own ``pg_backend_pid()`` would name whichever server connection answered that query.
    """
    deadline = time.monotonic() + 10
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity "
                "WHERE %s = ANY(pg_blocking_pids(pid)))",
                [holder_pid],
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"no backend ever waited for backend {holder_pid}'s lock")


@pytest.mark.postgres
def test_a_claim_that_waited_gets_its_whole_lease(record_table):
    """A claim queued behind another writer of its scope (longer than its lease) is
    stamped after the wait: it is never born with a spent lease."""
    retention.sweep()  # the claim's partition exists: the lock is its only wait
    sc = scope()
    lease = 0.2
    holder = connection.copy()
    runner = Runner()
    ready = threading.Event()
    try:
        holder.set_autocommit(False)
        holder_pid = _backend_pid(holder)
        with holder.cursor() as cursor:
            if record_table == "partitioned":  # another writer holds the scope's lock
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s || chr(31) || %s || "
                    "chr(31) || %s, 7310034283826791680))",
                    [sc.principal, sc.endpoint, sc.key],
                )
            else:  # another transaction inserted the scope and has not committed
                cursor.execute(
                    "INSERT INTO django_idempotency_record (principal, endpoint, key, "
                    "fingerprint, state, owner_token, lease_until, recovery_point, "
                    "response_headers, created_at, expires_at, sweep_after) VALUES "
                    "(%s, %s, %s, %s, 'claimed', %s, now(), '', '[]', now(), now(), now())",
                    [sc.principal, sc.endpoint, sc.key, FP, uuid.uuid4()],
                )

        def waiter():
            ready.set()
            return claim(sc, lease=lease)

        runner.start(waiter)
        assert ready.wait(10)
        _wait_until_someone_waits_for(holder_pid)
        with holder.cursor() as cursor:
            # The holder runs on past the waiter's lease, then gives up (rolls back).
            cursor.execute("SELECT pg_sleep(%s)", [3 * lease])
            cursor.execute("SELECT clock_timestamp()")
            (released,) = cursor.fetchone()
        holder.rollback()
        (won,) = runner.join()
    finally:
        holder.close()
    assert isinstance(won, store.Claim)
    record = IdempotencyRecord.objects.get(pk=won.record_id)
    assert record.created_at >= released
    assert record.lease_until - record.created_at == dt.timedelta(seconds=lease)
    assert record.expires_at >= record.lease_until


# --- takeovers never wait on a stalled original ---------------------------------------


@pytest.mark.postgres
def test_a_takeover_skips_a_row_locked_by_a_stalled_owner(record_table):
    """The original wrote its completion (row locked) and stalled before COMMIT: a
    retry answers in flight at once instead of queueing behind it."""
    sc = scope()
    original = claim(sc, lease=5)
    assert isinstance(original, store.Claim)
    stalled = connection.copy()
    runner = Runner()
    try:
        stalled.set_autocommit(False)
        with stalled.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM django_idempotency_record WHERE id = %s FOR UPDATE",
                [original.record_id],
            )

        def retry():
            with testing.travel(10):
                return claim(sc, lease=5)

        runner.start(retry)
        (result,) = runner.join(timeout=20)
    finally:
        stalled.rollback()
        stalled.close()
    assert isinstance(result, store.Existing) and not result.completed


@pytest.mark.postgres
def test_a_takeover_enqueues_without_waiting_for_the_stalled_original(record_table, alice, key):
    """The original enqueued its message (default dedup key) and hangs uncommitted; the
    retry that takes it over enqueues and completes without waiting; the original is
    then fenced, and one message is left."""
    name = uuid.uuid4().hex
    GATES[name] = gate = Gate()
    runner = Runner()
    try:
        runner.start(
            lambda: token_client(alice.key).post(
                "/notify-slow", {}, format="json", HTTP_IDEMPOTENCY_KEY=key, HTTP_X_GATE=name
            )
        )
        assert gate.entered.wait(10)
        retry_done = threading.Event()
        results: list = []

        def retry():
            with testing.travel(6):  # the original's 5 s lease is over
                results.append(
                    token_client(alice.key).post(
                        "/notify-slow", {}, format="json", HTTP_IDEMPOTENCY_KEY=key
                    )
                )
            retry_done.set()

        thread = threading.Thread(target=lambda: (retry(), connections.close_all()), daemon=True)
        thread.start()
        assert retry_done.wait(20), "the retry waited on the stalled original"
        thread.join(10)
        assert not thread.is_alive()
        assert results[0].status_code == 201, results[0].content
    finally:
        gate.opened.set()
        del GATES[name]
    (first,) = runner.join()
    assert first.status_code == 409 and first.json()["type"].endswith("lease-lost")
    (message,) = OutboxMessage.objects.all()
    assert message.dedup_key == results[0].json()["key"]


# --- isolation levels (PostgreSQL) ----------------------------------------------------


@pytest.fixture(params=["REPEATABLE_READ", "SERIALIZABLE"])
def strict_isolation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Django opens every transaction on ``default`` at this isolation level."""
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    options = connection.settings_dict.setdefault("OPTIONS", {})
    before = options.get("isolation_level")
    options["isolation_level"] = getattr(IsolationLevel, request.param)
    connections.close_all()
    try:
        yield request.param
    finally:
        if before is None:
            options.pop("isolation_level", None)
        else:
            options["isolation_level"] = before
        connections.close_all()


@pytest.mark.postgres
def test_claims_work_at_stricter_isolation_levels(record_table, strict_isolation, api, key):
    assert store.stricter_than_read_committed(connection)
    first = api.post("/widgets", {"name": "w"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    replay = api.post("/widgets", {"name": "w"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert (first.status_code, replay.status_code) == (201, 201)
    assert replay.headers["Idempotent-Replayed"] == "true"
    sc = scope()
    barrier = threading.Barrier(8)
    runner = Runner()
    for _ in range(8):
        runner.start(lambda: (barrier.wait(10), claim(sc))[1])
    assert sum(isinstance(r, store.Claim) for r in runner.join()) == 1


@pytest.mark.postgres
def test_a_takeover_fences_the_original_with_409_at_stricter_levels(
    record_table, strict_isolation, alice, key
):
    name = uuid.uuid4().hex
    GATES[name] = gate = Gate()
    runner = Runner()
    try:
        runner.start(
            lambda: token_client(alice.key).post(
                "/slow", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key, HTTP_X_GATE=name
            )
        )
        assert gate.entered.wait(10)
        with testing.travel(6):
            taker = token_client(alice.key).post(
                "/slow", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key
            )
        connections.close_all()
        assert taker.status_code == 201, taker.content
    finally:
        gate.opened.set()
        del GATES[name]
    (first,) = runner.join()
    assert first.status_code == 409, first.content
    assert first.json()["type"].endswith("lease-lost")


@pytest.mark.postgres
def test_a_heartbeat_is_refused_clearly_at_stricter_levels(
    record_table, strict_isolation, api, key
):
    with pytest.raises(exceptions.HeartbeatUnavailable, match="READ COMMITTED"):
        api.post("/heartbeat", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert not IdempotencyRecord.objects.filter(key=key).exists()  # released


@pytest.mark.postgres
def test_a_server_default_isolation_is_detected_by_the_claim(
    record_table, server_repeatable_read, api, key
):
    """Django thinks READ COMMITTED; the server defaults to REPEATABLE READ."""
    first = api.post("/widgets", {"name": "w"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    replay = api.post("/widgets", {"name": "w"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert (first.status_code, replay.status_code) == (201, 201)
    assert replay.headers["Idempotent-Replayed"] == "true"


# --- partitions ahead, migrations -----------------------------------------------------


@pytest.mark.postgres
def test_the_sweeper_creates_every_partition_a_claim_needs(record_table):
    if record_table != "partitioned":
        pytest.skip("partitions only")
    today = clock.store_now(connection).date()
    farthest = today + dt.timedelta(days=tables.days_ahead())
    for partition in partitions.list_partitions(connection):
        if partition.day == farthest:  # the sweeper must make it again
            assert partitions.drop(connection, partition, lock_timeout=10)
    retention.sweep()
    before = {p.name for p in partitions.list_partitions(connection)}
    needed = {
        partitions.partition_name(today + dt.timedelta(days=n))
        for n in range(tables.days_ahead() + 1)
    }
    assert needed <= before
    won = claim(scope(), retention_s=7 * DAY)  # MAX_RETENTION's window: created already
    assert {p.name for p in partitions.list_partitions(connection)} == before
    with connection.cursor() as cursor:  # its own day, not the default partition
        cursor.execute(
            "SELECT tableoid::regclass::text FROM django_idempotency_record WHERE id = %s",
            [won.record_id],
        )
        assert cursor.fetchone()[0] == partitions.partition_name(partition_day(won))


def test_record_migrations_pass_router_hints():
    from importlib import import_module

    for name in ("0001_initial",):
        module = import_module(f"django_idempotency.migrations.{name}")
        runs = [op for op in module.Migration.operations if op.__class__.__name__ == "RunPython"]
        assert runs and all(op.hints == {"model_name": "idempotencyrecord"} for op in runs)
