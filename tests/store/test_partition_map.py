"""Reloading every session's map of the record table's partitions (PostgreSQL).

``store.catalog.reload_partition_map`` is what a claim does when its insert finds no
partition for a day whose partition exists, and what the sweeper does once it has
attached new days. It must wait for no claim, completion or read, wait only briefly
for a partition change, keep the caller's settings, and fail softly for a role that
does not own the table. Real sessions, no mocks; no sleeps (lock timeouts end waits).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency import retention, store
from django_idempotency.retention import partitions
from django_idempotency.store import catalog, claims, clock
from django_idempotency.store.schema.tables import days_ahead
from tests.support.concurrency import Runner

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DAY = 86400.0


def scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))


def other_session():
    """A second connection to the test database, in a transaction of its own."""
    other = connection.copy()
    other.set_autocommit(False)
    return other


def lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return cursor.fetchone()[0]


def test_a_reload_waits_for_no_claim_in_flight():
    """A transaction that inserted a claimed record and has not committed holds the
    table in ROW EXCLUSIVE mode: the reload's SHARE UPDATE EXCLUSIVE does not wait."""
    partitions.ensure(connection, (clock.store_now(connection) + dt.timedelta(days=1)).date())
    other = other_session()
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "INSERT INTO django_idempotency_record (principal, endpoint, key, "
                "fingerprint, state, owner_token, lease_until, recovery_point, "
                "response_headers, created_at, expires_at, sweep_after, request_path) "
                "SELECT 'p', 'e', 'held', 'f', 'claimed', gen_random_uuid(), now(), '', "
                "'[]', now(), now() + interval '1 day', now() + interval '1 day', ''"
            )
        assert catalog.reload_partition_map(connection) is True
    finally:
        other.rollback()
        other.close()


def test_a_reload_waits_only_briefly_for_a_partition_being_attached(caplog):
    """An attach not yet committed holds the table: the reload gives up after its own
    lock timeout, says so once, and the session's ``lock_timeout`` is as it was."""
    day = dt.date(2035, 1, 1) + dt.timedelta(days=uuid.uuid4().int % 1000)
    other = other_session()
    catalog._reload_failed.discard(connection.alias)
    before = lock_timeout()
    try:
        assert partitions.ensure(other, day) is True  # uncommitted: holds the table
        with caplog.at_level(logging.WARNING, logger="django_idempotency"):
            assert catalog.reload_partition_map(connection) is False
            assert catalog.reload_partition_map(connection) is False
        assert lock_timeout() == before
    finally:
        other.rollback()
        other.close()
        catalog._reload_failed.discard(connection.alias)
    warnings = [r for r in caplog.records if "re-read the partitions" in r.getMessage()]
    assert len(warnings) == 1
    assert catalog.reload_partition_map(connection) is True  # the attach is gone


def test_a_reload_sends_nothing_inside_a_callers_transaction():
    """Its lock would stay until the caller's transaction ends, and every attach (another
    session's claim making a day, the sweeper) would wait for it."""
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        assert catalog.reload_partition_map(connection) is False
        assert "ShareUpdateExclusiveLock" not in parent_lock_modes()
    assert not any("RESET (n_distinct)" in q["sql"] for q in queries.captured_queries)


def test_a_role_that_does_not_own_the_table_cannot_reload_and_the_claim_still_answers():
    """The reload needs the table's owner. A role with the rights claims need but not
    ownership gets ``False`` from it, and its claims still work."""
    role = f"idem_app_{uuid.uuid4().hex[:8]}"
    # The claim's day exists, made by the owner: this role could not make it either.
    partitions.ensure(connection, (clock.store_now(connection) + dt.timedelta(days=3)).date())
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} NOLOGIN")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SET ROLE {role}")
        assert catalog.reload_partition_map(connection) is False
        won = store.claim(scope(), "a" * 64, lease=30, retention=3 * DAY)
        assert isinstance(won, store.Claim)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
            cursor.execute(f"DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE {role}")


def test_a_sweep_that_attaches_days_reloads_the_partition_maps_after_committing():
    """A session that built its map while one of the sweeper's attaches committed may
    have kept it without the new day: the sweep reloads every map once its attaches
    are committed."""
    furthest = clock.store_now(connection).date() + dt.timedelta(days=days_ahead())
    with connection.cursor() as cursor:  # the sweep makes it again
        cursor.execute(f"DROP TABLE IF EXISTS {partitions.partition_name(furthest)}")
    with CaptureQueriesContext(connection) as queries:
        report = retention.sweep()
    assert furthest in report.created
    sql = [q["sql"] for q in queries.captured_queries]
    ensures = [n for n, s in enumerate(sql) if "django_idempotency_ensure_partition" in s]
    reloads = [n for n, s in enumerate(sql) if "RESET (n_distinct)" in s]
    assert len(reloads) == 1 and reloads[0] > max(ensures)


# --- a claim whose map of partitions lacks its day ----------------------------------


FP = "a" * 64


def day_for(window: float) -> dt.date:
    return (clock.store_now(connection) + dt.timedelta(seconds=window)).date()


def far_window(base_days: int) -> float:
    """A window ending on a day no other test makes (random week, so reruns differ)."""
    return base_days * DAY + 7 * DAY * (uuid.uuid4().int % 50)


def drop_days(*days: dt.date) -> None:
    with connection.cursor() as cursor:
        for day in days:
            cursor.execute(f"DROP TABLE IF EXISTS {partitions.partition_name(day)}")


def own_day_made() -> None:
    """Make the day of a claim with a 3-day window, outside the test's transaction: a
    claim that made it inside would hold the table against every attach until the
    transaction ends (docs/retention.md, limits)."""
    partitions.ensure(connection, day_for(3 * DAY))


def claim_statements(sql: list[str]) -> int:
    return sum("django_idempotency_claim(" in s for s in sql)


def parent_lock_modes() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT mode FROM pg_locks WHERE pid = pg_backend_pid() AND granted "
            "AND relation = 'django_idempotency_record'::regclass"
        )
        return {row[0] for row in cursor.fetchall()}


def claim_after_an_attach_in_this_transaction(window: float) -> tuple[object, list[str]]:
    """In the caller's open transaction: a claim (the session now holds the table), a
    day attached by another session, then a claim whose window ends on that day. Run on
    a new session with the process-wide facts read again, so the first claim builds
    the session's map of partitions. The first claim's day exists beforehand (see
    ``own_day_made``)."""
    assert isinstance(store.claim(scope(), FP, lease=30, retention=3 * DAY), store.Claim)
    attacher = Runner()
    attacher.start(lambda: partitions.ensure(connections["default"], day_for(window)))
    assert attacher.join() == [True]
    with CaptureQueriesContext(connection) as queries:
        answer = store.claim(scope(), FP, lease=30, retention=window)
    return answer, [q["sql"] for q in queries.captured_queries]


def test_a_claim_in_a_transaction_that_missed_an_attach_holds_nothing_an_attach_waits_for():
    """Its first insert finds no partition; the next round claims. No reload is sent: its
    lock would stay until the caller's transaction ends and stall every attach (another
    session's claim on a new day, the sweeper) or deadlock with one."""
    window, other_window = far_window(2400), far_window(2400) + 400 * DAY
    runner = Runner()
    own_day_made()
    connection.close()
    catalog.forget()
    try:
        with transaction.atomic():
            answer, sql = claim_after_an_attach_in_this_transaction(window)
            assert isinstance(answer, store.Claim)
            assert claim_statements(sql) >= 2  # its first insert found no partition
            assert not any("RESET (n_distinct)" in s for s in sql)
            assert "ShareUpdateExclusiveLock" not in parent_lock_modes()
            # Another session makes a day while this transaction is open.
            runner.start(lambda: store.claim(scope(), FP, lease=30, retention=other_window))
            [other] = runner.join(timeout=10)
            assert isinstance(other, store.Claim)
            transaction.set_rollback(True)
    finally:
        drop_days(day_for(window), day_for(other_window))


def test_a_day_whose_table_is_left_detached_costs_one_reload_a_second_not_one_a_claim(
    monkeypatch,
):
    """A table of the day's name that is not attached (a detach by hand) fails every
    insert of the day like a stale map would. The claims answer 409 after their rounds;
    the process reloads every session's map at most once a second for them."""
    window = far_window(3700)
    day = day_for(window)
    name = partitions.partition_name(day)
    partitions.ensure(connection, day)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE django_idempotency_record DETACH PARTITION {name}")
    monkeypatch.setattr(claims, "_RELOAD_INTERVAL", 3600.0)  # no second may pass
    monkeypatch.setattr(claims, "_reloaded_at", {})
    try:
        with CaptureQueriesContext(connection) as queries:
            answers = [store.claim(scope(), FP, lease=30, retention=window) for _ in range(3)]
    finally:
        drop_days(day)
    assert all(isinstance(a, store.Existing) and not a.completed for a in answers)
    assert sum("RESET (n_distinct)" in q["sql"] for q in queries.captured_queries) == 1


@pytest.mark.xfail(
    strict=True,
    reason="documented limit (docs/retention.md, limits): a transaction "
    "that holds the table since before an attach does not see the new day's records; "
    "a claim of the same key whose window ends on another day is not refused",
)
def test_a_transaction_that_missed_an_attach_does_not_claim_a_key_held_on_that_day():
    window = far_window(4100)
    shared = scope()
    own_day_made()
    connection.close()
    runner = Runner()
    try:
        with transaction.atomic():
            assert isinstance(store.claim(scope(), FP, lease=30, retention=3 * DAY), store.Claim)

            def first_holder():
                partitions.ensure(connections["default"], day_for(window))
                return store.claim(shared, FP, lease=30, retention=window)

            runner.start(first_holder)
            [held] = runner.join()
            assert isinstance(held, store.Claim) and held.committed
            second = store.claim(shared, FP, lease=30, retention=3 * DAY)
            transaction.set_rollback(True)
    finally:
        drop_days(day_for(window))
    assert not isinstance(second, store.Claim)
