"""The retention sweeper's rules, on SQLite and PostgreSQL (docs/retention.md).

Behaviour through the public functions, whatever the table kind: on PostgreSQL the
records' days are partitions (dropped), on SQLite rows (deleted in batches).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_idempotency import retention, store, testing
from django_idempotency.checks.settings import check_settings
from django_idempotency.checks.views import check_view_retention
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.store import clock
from tests.support.factories import create_window_day

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]

DAY = 86400.0
FP, OTHER_FP = "a" * 64, "b" * 64


def claim(*, retention_s: float = DAY, key: str | None = None, fp: str = FP):
    sc = store.Scope("auth.user:1", "POST /widgets", key or str(uuid.uuid4()))
    return store.claim(sc, fp, lease=30, retention=retention_s)


def done(won: store.Claim) -> None:
    with transaction.atomic():
        store.complete(won, store.StoredResponse(201, [], b"{}"))


def exists(won: store.Claim) -> bool:
    return IdempotencyRecord.objects.filter(pk=won.record_id).exists()


def test_sweep_keeps_each_record_for_its_own_window():
    with testing.travel(-9 * DAY):
        nine_days = claim()
    with testing.travel(-6 * DAY):
        six_days = claim()  # a one-day window, over five days ago
        six_days_long = claim(retention_s=7 * DAY)  # a week: still inside it
    today = claim()
    report = retention.sweep()
    assert not report.skipped and not report.errors
    assert not exists(nine_days) and not exists(six_days)
    assert exists(six_days_long) and exists(today)
    assert report.method == ("partitions" if connection.vendor == "postgresql" else "delete")


def replays(key: str, *, retention_s: float) -> bool:
    found = claim(retention_s=retention_s, key=key)
    return isinstance(found, store.Existing) and found.completed


def test_sweep_keeps_every_record_inside_its_window_and_forgets_those_past_it():
    """Behaviour, whatever the storage: after ``sweep()`` a record still inside its
    window replays (also on the oldest day the sweeper keeps); one past its window is
    gone, its key runs anew."""
    window = 7 * DAY
    with override_settings(IDEMPOTENCY={"MAX_RETENTION": window}):
        inside = {}
        for margin in (60, 600, 3600):  # window - margin old: the oldest kept day
            key = str(uuid.uuid4())
            with testing.travel(-(window - margin)):
                done(claim(retention_s=window, key=key))
            inside[key] = margin
        past = str(uuid.uuid4())
        with testing.travel(-(window + 2 * DAY)):
            done(claim(retention_s=DAY, key=past))
        report = retention.sweep()
        assert not report.errors
        for key in inside:
            assert replays(key, retention_s=window), inside[key]
        assert IdempotencyRecord.objects.filter(key=past).count() == 0
        fresh = claim(key=past, fp=OTHER_FP)
        assert isinstance(fresh, store.Claim) and not fresh.taken_over


def test_sweep_never_forgets_a_record_whose_lease_is_live():
    key = str(uuid.uuid4())
    with testing.travel(-9 * DAY):
        owner = claim(retention_s=DAY, key=key)
    assert store.extend(owner, 600) is True  # a long handler's heartbeat, now
    retention.sweep()
    duplicate = claim(key=key)
    assert isinstance(duplicate, store.Existing) and duplicate.lease_remaining > 0
    done(owner)


def test_inside_a_kept_day_an_expired_record_is_absent_to_the_claim():
    won = claim(retention_s=60)
    done(won)
    with testing.travel(120):
        report = retention.sweep()
        # Rows are deleted as soon as window and lease are over; a partition waits for
        # the end of its day ...
        assert exists(won) == (report.method == "partitions")
        fresh = claim(retention_s=60, key=won.scope.key, fp=OTHER_FP)
    assert isinstance(fresh, store.Claim)  # ... but the claim treats it as absent


def test_dry_run_reports_and_changes_nothing():
    with testing.travel(-9 * DAY):
        create_window_day(DAY)
        old = claim()
    report = retention.sweep(dry_run=True)
    assert report.dry_run and exists(old)
    if report.method == "delete":
        assert report.deleted_records == 1
    else:
        assert report.dropped and all(p.day < report.cutoff.date() for p in report.dropped)
    assert not retention.sweep().dry_run and not exists(old)


def test_sweeping_again_does_nothing_more():
    with testing.travel(-9 * DAY):
        claim()
    first = retention.sweep()
    assert first.deleted_records or first.dropped
    second = retention.sweep()
    assert (second.deleted_records, second.dropped, second.created) == (0, [], [])


def test_batched_delete_removes_everything_in_small_batches():
    with testing.travel(-9 * DAY):
        create_window_day(DAY)
        for _ in range(7):
            claim()
    kept = claim()
    with override_settings(IDEMPOTENCY={"SWEEP_BATCH_SIZE": 2}):
        report = retention.sweep()
    if report.method == "delete":
        assert report.deleted_records == 7
    else:  # PostgreSQL's partitioned table: the whole day goes, no row is deleted
        old_day = (report.now - dt.timedelta(days=8)).date()  # where its window ended
        assert report.deleted_records == 0
        assert old_day in {p.day for p in report.dropped}
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [kept.record_id]


def _message(state: str, sent_days_ago: float | None, created_days_ago: float = 0) -> OutboxMessage:
    now = clock.store_now(connection)
    sent_at = None if sent_days_ago is None else now - dt.timedelta(days=sent_days_ago)
    return OutboxMessage.objects.create(
        topic="t",
        dedup_key=str(uuid.uuid4()),
        state=state,
        sent_at=sent_at,
        created_at=now - dt.timedelta(days=created_days_ago),
    )


def test_sent_outbox_messages_past_their_retention_are_swept():
    old_sent = _message(OutboxState.SENT, 8, 9)
    recent_sent = _message(OutboxState.SENT, 2 / 24)
    old_pending = _message(OutboxState.PENDING, None, 30)
    old_dead = _message(OutboxState.DEAD, None, 30)
    dry = retention.sweep(dry_run=True)
    assert dry.deleted_outbox == 1 and OutboxMessage.objects.count() == 4
    assert retention.sweep().deleted_outbox == 1
    left = set(OutboxMessage.objects.values_list("pk", flat=True))
    assert left == {recent_sent.pk, old_pending.pk, old_dead.pk}
    assert old_sent.pk not in left
    with override_settings(IDEMPOTENCY={"OUTBOX_RETENTION": 3600, "SWEEP_BATCH_SIZE": 1}):
        assert retention.sweep().deleted_outbox == 1
    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == {old_pending.pk, old_dead.pk}


def test_the_report_is_json_serialisable():
    with testing.travel(-9 * DAY):
        claim()
    data = json.loads(json.dumps(retention.sweep().as_dict()))
    assert data["database"] == "default" and data["method"] in ("partitions", "delete")
    assert dt.datetime.fromisoformat(data["cutoff"]) <= dt.datetime.fromisoformat(data["now"])


# --- checks ----------------------------------------------------------------------------


def ids(messages):
    return [m.id for m in messages]


def test_default_settings_pass_the_retention_checks():
    assert check_settings() == [] and check_view_retention() == []


@override_settings(IDEMPOTENCY={"MAX_RETENTION": 3600})
def test_max_retention_shorter_than_retention_is_no_error():
    """Nothing is swept early: the sweeper follows each record's own window."""
    assert check_settings() == []


@pytest.mark.parametrize(
    "values",
    [
        {"MAX_RETENTION": 0},
        {"MAX_RETENTION": "x"},
        {"PARTITIONS_AHEAD": -1},
        {"SWEEP_BATCH_SIZE": 0},
        {"OUTBOX_RETENTION": -5},
    ],
)
def test_e006_invalid_sweeper_settings(values):
    with override_settings(IDEMPOTENCY=values):
        assert ids(check_settings()) == ["django_idempotency.E006"]


@override_settings(IDEMPOTENCY={"MAX_RETENTION": 3000, "RETENTION": 600})
def test_w002_a_view_keeps_keys_longer_than_max_retention():
    messages = check_view_retention()
    assert set(ids(messages)) == {"django_idempotency.W002"}
    text = " ".join(m.msg for m in messages)
    assert "optional_key" in text and "604800 s (7 days)" in text  # below @api_view
    assert "e+0" not in text and "(3000 s)" in text
    assert not any("WrappedAPIView" in str(m) for m in messages)
    assert "WidgetViewSet" in text and "3600" in text  # IdempotentMixin per action
