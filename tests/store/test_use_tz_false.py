"""``USE_TZ = False``: leases, expiry and sweeping follow real elapsed time (UTC).

Every test runs with ``USE_TZ = False`` and ``TIME_ZONE = "Europe/Paris"`` and puts
the store's clock just before a daylight-saving change (docs/storage.md, "Time zones"):

* spring forward, 2026-03-29 01:00 UTC: local time jumps from 02:00 to 03:00;
* fall back, 2026-10-25 01:00 UTC: local time goes back from 03:00 to 02:00.

On SQLite the store's clock is the application's: ``time-machine`` moves it (and the
process's local time, so naive local arithmetic would be caught). On PostgreSQL it is
the database's: ``testing.travel`` offsets ``statement_timestamp()`` to the same
instant. ``override_settings`` on ``USE_TZ`` / ``TIME_ZONE`` makes Django's
``setting_changed`` receivers reset the process time zone (``tzset``) and every open
connection's (``SET TIME ZONE`` on PostgreSQL), so the live test connection follows.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings

from django_idempotency import outbox, retention, store
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.store import clock

pytestmark = pytest.mark.django_db(transaction=True)

ZONE = "Europe/Paris"
SPRING_FORWARD = dt.datetime(2026, 3, 29, 1, 0, tzinfo=dt.UTC)
FALL_BACK = dt.datetime(2026, 10, 25, 1, 0, tzinfo=dt.UTC)
DAY = 86400.0
FP = "a" * 64
LEASE = 30.0


@pytest.fixture(autouse=True)
def local_naive_time(transactional_db: Any) -> Iterator[None]:
    with override_settings(USE_TZ=False, TIME_ZONE=ZONE):
        yield


class StoreClock:
    """Moves the store's clock: time-machine on SQLite, the clock offset on PostgreSQL."""

    def __init__(self) -> None:
        self._traveller: Any = None

    @contextmanager
    def at(self, moment: dt.datetime) -> Iterator[StoreClock]:
        before = clock.offset()
        if connection.vendor == "postgresql":
            real = dt.datetime.now(dt.UTC)
            clock.set_offset(before + (moment - real).total_seconds())
            try:
                yield self
            finally:
                clock.set_offset(before)
            return
        # A timestamp, not an aware datetime: time-machine would also mock the local
        # time zone to the datetime's (UTC), hiding what naive local time does.
        with time_machine.travel(moment.timestamp(), tick=False) as traveller:
            self._traveller = traveller
            try:
                yield self
            finally:
                self._traveller = None

    def shift(self, seconds: float) -> None:
        if self._traveller is not None:
            self._traveller.shift(seconds)
        else:
            clock.set_offset(clock.offset() + seconds)


@pytest.fixture
def store_clock() -> StoreClock:
    return StoreClock()


def scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))


def response() -> store.StoredResponse:
    return store.StoredResponse(201, [("Content-Type", "application/json")], b'{"id": 1}')


def test_local_time_is_what_the_test_says() -> None:
    """The setup itself: naive local time is Paris time, connections follow."""
    from django.utils import timezone

    assert timezone.is_naive(timezone.now())
    assert clock.app_now().tzinfo is dt.UTC
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW TIME ZONE")
            assert cursor.fetchone()[0] == ZONE


def test_lease_is_not_cut_short_at_spring_forward(store_clock: StoreClock) -> None:
    sc = scope()
    with store_clock.at(SPRING_FORWARD - dt.timedelta(seconds=10)):
        assert isinstance(store.claim(sc, FP, lease=LEASE, retention=DAY), store.Claim)
        store_clock.shift(12)  # local time is now 03:00:02: a naive clock saw an hour
        live = store.claim(sc, FP, lease=LEASE, retention=DAY)
        assert isinstance(live, store.Existing)
        assert 10 < live.lease_remaining <= 18
        store_clock.shift(19)
        taken = store.claim(sc, FP, lease=LEASE, retention=DAY)
        assert isinstance(taken, store.Claim) and taken.taken_over


def test_lease_is_not_extended_at_fall_back(store_clock: StoreClock) -> None:
    sc = scope()
    with store_clock.at(FALL_BACK - dt.timedelta(seconds=10)):
        assert isinstance(store.claim(sc, FP, lease=LEASE, retention=DAY), store.Claim)
        store_clock.shift(31)  # local time is now 02:00:21, "before" the claim
        taken = store.claim(sc, FP, lease=LEASE, retention=DAY)
        assert isinstance(taken, store.Claim) and taken.taken_over


def test_heartbeat_extends_by_real_seconds(store_clock: StoreClock) -> None:
    sc = scope()
    with store_clock.at(FALL_BACK - dt.timedelta(seconds=5)):
        won = store.claim(sc, FP, lease=LEASE, retention=DAY)
        assert isinstance(won, store.Claim)
        assert store.extend(won, 60)
        store_clock.shift(45)
        live = store.claim(sc, FP, lease=LEASE, retention=DAY)
        assert isinstance(live, store.Existing) and 10 < live.lease_remaining <= 15
        store_clock.shift(16)
        assert isinstance(store.claim(sc, FP, lease=LEASE, retention=DAY), store.Claim)


@pytest.mark.parametrize("jump", [SPRING_FORWARD, FALL_BACK], ids=["spring", "fall"])
def test_expiry_follows_real_time(store_clock: StoreClock, jump: dt.datetime) -> None:
    sc = scope()
    with store_clock.at(jump - dt.timedelta(seconds=30)):
        won = store.claim(sc, FP, lease=LEASE, retention=60)
        assert isinstance(won, store.Claim)
        with transaction.atomic():
            store.complete(won, response())
        store_clock.shift(50)
        replay = store.claim(sc, FP, lease=LEASE, retention=60)
        assert isinstance(replay, store.Existing) and replay.completed and not replay.expired
        store_clock.shift(11)
        fresh = store.claim(sc, FP, lease=LEASE, retention=60)
        assert isinstance(fresh, store.Claim) and not fresh.taken_over


def test_stored_values_are_utc(store_clock: StoreClock) -> None:
    """What lands in the columns never depends on TIME_ZONE."""
    moment = dt.datetime(2026, 7, 1, 12, 0, tzinfo=dt.UTC)  # 14:00 in Paris
    sc = scope()
    with store_clock.at(moment):
        won = store.claim(sc, FP, lease=LEASE, retention=DAY)
        assert isinstance(won, store.Claim)
    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT created_at AT TIME ZONE 'UTC', "
                f"EXTRACT(EPOCH FROM lease_until - created_at) FROM {table} WHERE id = %s",
                [won.record_id],
            )
            created, lease = cursor.fetchone()
            assert abs((created - moment.replace(tzinfo=None)).total_seconds()) < 60
            assert float(lease) == pytest.approx(LEASE)
        else:
            cursor.execute(
                f"SELECT CAST(created_at AS TEXT), CAST(lease_until AS TEXT) FROM {table} "
                "WHERE id = %s",
                [won.record_id],
            )
            assert cursor.fetchone() == ("2026-07-01 12:00:00", "2026-07-01 12:00:30")


def _old_record(store_clock: StoreClock, moment: dt.datetime) -> int:
    with store_clock.at(moment):
        won = store.claim(scope(), FP, lease=LEASE, retention=DAY)
    assert isinstance(won, store.Claim)
    return won.record_id


def _sent_message(store_clock: StoreClock, moment: dt.datetime) -> int:
    outbox.register("tz.topic")(lambda message, dedup_key: None)
    try:
        with store_clock.at(moment):
            with transaction.atomic():
                message = outbox.enqueue("tz.topic", {"n": 1})
            assert relay.deliver_batch(10) == 1
    finally:
        outbox.unregister("tz.topic")
    assert OutboxMessage.objects.get(pk=message.pk).state == OutboxState.SENT
    return int(message.pk)


def test_sweep_runs_and_deletes_what_is_expired(store_clock: StoreClock) -> None:
    now = dt.datetime.now(dt.UTC)
    old = _old_record(store_clock, now - dt.timedelta(days=9))
    old_message = _sent_message(store_clock, now - dt.timedelta(days=9))
    kept = _old_record(store_clock, now - dt.timedelta(hours=1))
    kept_message = _sent_message(store_clock, now - dt.timedelta(hours=1))
    report = retention.sweep()
    assert report.now.tzinfo is not None and report.cutoff.tzinfo is not None
    assert abs((report.now - now).total_seconds()) < 600
    assert not IdempotencyRecord.objects.filter(pk=old).exists()
    assert IdempotencyRecord.objects.filter(pk=kept).exists()
    assert report.deleted_outbox == 1
    assert list(OutboxMessage.objects.values_list("pk", flat=True)) == [kept_message]
    assert old_message != kept_message


def test_sweep_command_runs(store_clock: StoreClock) -> None:
    old = _old_record(store_clock, dt.datetime.now(dt.UTC) - dt.timedelta(days=9))
    out = StringIO()
    call_command("idempotency_sweep", stdout=out, stderr=StringIO())
    assert "UTC" in out.getvalue()
    assert not IdempotencyRecord.objects.filter(pk=old).exists()


@pytest.mark.parametrize(
    "moment",
    [FALL_BACK - dt.timedelta(minutes=30), FALL_BACK + dt.timedelta(minutes=30)],
    ids=["first-02:30", "second-02:30"],
)
def test_relay_marks_sent_in_the_repeated_hour(
    store_clock: StoreClock, moment: dt.datetime
) -> None:
    """The relay's fence compares exact instants, even where local time is ambiguous."""
    seen: list[int] = []
    outbox.register("tz.topic")(lambda message, dedup_key: seen.append(message.pk))
    try:
        with store_clock.at(moment):
            with transaction.atomic():
                message = outbox.enqueue("tz.topic", {"n": 1})
            assert relay.deliver_batch(10) == 1
            store_clock.shift(3600)
            assert relay.deliver_batch(10) == 0
    finally:
        outbox.unregister("tz.topic")
    assert seen == [message.pk]
    assert OutboxMessage.objects.get(pk=message.pk).state == OutboxState.SENT


def test_enqueue_available_at_is_an_instant(store_clock: StoreClock) -> None:
    """An aware ``available_at`` is accepted; a naive one is local time in TIME_ZONE."""
    seen: list[Any] = []
    outbox.register("tz.topic")(lambda message, dedup_key: seen.append(message.payload))
    start = SPRING_FORWARD - dt.timedelta(seconds=30)
    try:
        with store_clock.at(start):
            with transaction.atomic():
                outbox.enqueue("tz.topic", "aware", available_at=start + dt.timedelta(seconds=60))
                # 01:59:30 local + 3 minutes is 03:02:30 local, 01:02:30 UTC.
                naive_local = dt.datetime(2026, 3, 29, 3, 2, 30)
                outbox.enqueue("tz.topic", "naive", available_at=naive_local)
            assert relay.deliver_batch(10) == 0
            store_clock.shift(61)
            assert relay.deliver_batch(10) == 1
            store_clock.shift(60)
            assert relay.deliver_batch(10) == 0
            store_clock.shift(60)
            assert relay.deliver_batch(10) == 1
    finally:
        outbox.unregister("tz.topic")
    assert seen == ["aware", "naive"]


def test_admin_lists_records_and_retries_dead_messages(store_clock: StoreClock) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "r@example.com", "pw"))
    moment = dt.datetime(2026, 7, 1, 9, 30, tzinfo=dt.UTC)  # 11:30 in Paris
    record = _old_record(store_clock, moment)
    base = "/admin/django_idempotency/idempotencyrecord/"
    assert client.get(base).status_code == 200
    detail = client.get(f"{base}{record}/change/")
    assert detail.status_code == 200
    # The record's page shows its times in UTC on either backend, whatever Django reads
    # for naive datetimes (UTC on SQLite, local time from timestamptz on PostgreSQL).
    assert "2026-07-01 09:30:00 UTC" in detail.content.decode()

    with transaction.atomic():
        dead = outbox.enqueue("tz.topic", {"n": 1}, available_at=moment)
    OutboxMessage.objects.filter(pk=dead.pk).update(state=OutboxState.DEAD, attempts=5)
    response = client.post(
        "/admin/django_idempotency/outboxmessage/",
        {"action": "retry_dead", "_selected_action": [dead.pk]},
        follow=True,
    )
    assert "1 dead message will be retried." in response.content.decode()
    seen: list[int] = []
    outbox.register("tz.topic")(lambda message, dedup_key: seen.append(message.pk))
    try:
        assert relay.deliver_batch(10) == 1  # due now, by the real clock
    finally:
        outbox.unregister("tz.topic")
    assert seen == [dead.pk]
