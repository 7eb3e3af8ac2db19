"""The record's state machine (docs/concepts.md) at the store level, on SQLite and PostgreSQL.

Runs with real transactions (``transaction=True``), so each claim commits on its own as
in production. Time moves with ``testing.travel``; nothing sleeps.
"""

from __future__ import annotations

import pytest
import time_machine
from django.db import connection, transaction

from django_idempotency import exceptions, store, testing
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]

FP = "a" * 64
OTHER_FP = "b" * 64
LEASE = 30.0
RETENTION = 3600.0


def scope(key: str = "k1") -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", key)


def claim(fp: str = FP, key: str = "k1"):
    return store.claim(scope(key), fp, lease=LEASE, retention=RETENTION)


def response(body: bytes = b'{"id": 1}') -> store.StoredResponse:
    return store.StoredResponse(201, [("Content-Type", "application/json")], body)


def test_none_to_claimed():
    won = claim()
    assert isinstance(won, store.Claim)
    assert not won.taken_over and won.recovery_point == ""
    record = IdempotencyRecord.objects.get(pk=won.record_id)
    assert record.state == RecordState.CLAIMED
    assert record.owner_token == won.owner_token
    assert record.fingerprint == FP
    assert 29 < (record.lease_until - record.created_at).total_seconds() <= 30.001
    assert (record.expires_at - record.created_at).total_seconds() == pytest.approx(RETENTION)


def test_live_claim_blocks_a_duplicate():
    claim()
    existing = claim()
    assert isinstance(existing, store.Existing)
    assert existing.state == RecordState.CLAIMED and existing.response is None
    assert 0 < existing.lease_remaining <= LEASE
    mismatch = claim(OTHER_FP)
    assert isinstance(mismatch, store.Existing) and mismatch.fingerprint == FP


def test_claimed_to_completed_then_replayed():
    won = claim()
    with transaction.atomic():
        store.complete(won, response())
    existing = claim()
    assert isinstance(existing, store.Existing) and existing.completed
    assert existing.response == response()
    record = IdempotencyRecord.objects.get()
    assert record.completed_at is not None and record.response_status == 201


def test_claimed_to_released_frees_the_key():
    won = claim()
    assert store.release(won) is True
    assert IdempotencyRecord.objects.count() == 0
    again = claim(OTHER_FP)
    assert isinstance(again, store.Claim)


def test_release_by_a_stale_owner_deletes_nothing():
    first = claim()
    with testing.travel(LEASE + 1):
        second = claim()
        assert isinstance(second, store.Claim) and second.taken_over
    assert store.release(first) is False
    assert IdempotencyRecord.objects.get().owner_token == second.owner_token


def test_expired_lease_is_taken_over_with_recovery_point_kept():
    first = claim()
    IdempotencyRecord.objects.update(recovery_point="allocated")
    with testing.travel(LEASE - 1):
        assert isinstance(claim(), store.Existing)  # still live
    with testing.travel(LEASE + 1):
        second = claim()
    assert isinstance(second, store.Claim)
    assert second.taken_over and second.recovery_point == "allocated"
    assert second.record_id == first.record_id
    assert second.owner_token != first.owner_token


def test_expired_lease_with_another_fingerprint_is_not_taken_over():
    claim()
    with testing.travel(LEASE + 1):
        existing = claim(OTHER_FP)
    assert isinstance(existing, store.Existing) and existing.fingerprint == FP


def test_stale_owner_completion_is_fenced_and_rolls_back_business_writes():
    stale = claim()
    with testing.travel(LEASE + 1):
        fresh = claim()
    assert isinstance(fresh, store.Claim)
    with pytest.raises(exceptions.LeaseLost), transaction.atomic():
        Widget.objects.create(name="stale effect")
        store.complete(stale, response(b"stale"))
    assert Widget.objects.count() == 0
    with transaction.atomic():
        Widget.objects.create(name="fresh effect")
        store.complete(fresh, response(b"fresh"))
    assert list(Widget.objects.values_list("name", flat=True)) == ["fresh effect"]
    assert bytes(IdempotencyRecord.objects.get().response_body) == b"fresh"


def test_completion_after_lease_end_without_takeover_succeeds():
    won = claim()
    with testing.travel(LEASE + 1), transaction.atomic():
        store.complete(won, response())
    assert IdempotencyRecord.objects.get().state == RecordState.COMPLETED


def test_completed_record_is_never_taken_over():
    won = claim()
    with transaction.atomic():
        store.complete(won, response())
    with testing.travel(LEASE * 10):
        existing = claim()
    assert isinstance(existing, store.Existing) and existing.completed


def test_heartbeat_extends_the_lease():
    won = claim()
    assert store.extend(won, 120) is True
    with testing.travel(90):
        assert isinstance(claim(), store.Existing)
    with testing.travel(121):
        taker = claim()
    assert isinstance(taker, store.Claim) and taker.taken_over
    assert store.extend(won, 120) is False  # lost: the old owner learns it


def test_heartbeat_inside_the_view_transaction_commits_at_once():
    won = claim()
    with transaction.atomic():
        Widget.objects.create(name="in progress")
        assert store.extend(won, 500) is True
        if connection.vendor == "postgresql":
            # Visible to other connections before the view's transaction ends.
            other = connection.copy()
            try:
                with other.cursor() as cursor:
                    cursor.execute(
                        "SELECT lease_until - now() > interval '400 seconds' "
                        "FROM django_idempotency_record WHERE id = %s",
                        [won.record_id],
                    )
                    assert cursor.fetchone() == (True,)
            finally:
                other.close()
        else:
            # SQLite has one writer: the heartbeat joins the view's transaction, so the
            # new lease is what this transaction reads, and commits with it.
            record = IdempotencyRecord.objects.get(pk=won.record_id)
            assert (record.lease_until - record.created_at).total_seconds() > 400
    record = IdempotencyRecord.objects.get(pk=won.record_id)
    assert (record.lease_until - record.created_at).total_seconds() > 400


def test_after_retention_the_key_is_new():
    won = claim()
    with transaction.atomic():
        store.complete(won, response())
    with testing.travel(RETENTION - 1):
        assert isinstance(claim(OTHER_FP), store.Existing)
    with testing.travel(RETENTION + 1):
        fresh = claim(OTHER_FP)
    assert isinstance(fresh, store.Claim) and not fresh.taken_over
    record = IdempotencyRecord.objects.get()
    assert record.state == RecordState.CLAIMED and record.fingerprint == OTHER_FP
    assert record.response_body is None and record.response_status is None


def test_fetch_reads_one_record():
    assert store.fetch(scope()) is None
    claim()
    fetched = store.fetch(scope())
    assert fetched is not None and fetched.state == RecordState.CLAIMED


def test_scopes_are_independent():
    assert isinstance(claim(key="k1"), store.Claim)
    assert isinstance(claim(key="k2"), store.Claim)
    other = store.claim(store.Scope("auth.user:2", "POST /widgets", "k1"), FP, lease=1, retention=2)
    assert isinstance(other, store.Claim)
    assert IdempotencyRecord.objects.count() == 3


def test_database_enforces_the_state_machine():
    from django.db import IntegrityError

    claim()
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecord.objects.update(state="bogus")
    with pytest.raises(IntegrityError), transaction.atomic():
        IdempotencyRecord.objects.update(state=RecordState.COMPLETED)  # no response
    with pytest.raises(IntegrityError), transaction.atomic():
        record = IdempotencyRecord.objects.get()
        record.pk = None
        record.save()  # duplicate (principal, endpoint, key)


@pytest.mark.postgres
def test_app_server_clock_skew_cannot_take_over_a_live_lease():
    """On PostgreSQL the database's clock rules: a fast app-server clock changes nothing."""
    claim()
    with time_machine.travel(3600, tick=True):
        existing = claim()
    assert isinstance(existing, store.Existing) and existing.lease_remaining > 0


@pytest.mark.postgres
def test_app_server_clock_behind_cannot_keep_a_dead_lease():
    claim()
    import datetime as dt

    from django.utils import timezone

    behind = timezone.now() - dt.timedelta(hours=1)
    with time_machine.travel(behind, tick=True), testing.travel(LEASE + 1):
        taker = claim()
    assert isinstance(taker, store.Claim) and taker.taken_over


def test_sqlite_follows_the_app_clock():
    """SQLite lives on the app server's disk: its clock is the app server's clock."""
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite clock rule")
    claim()
    import datetime as dt

    from django.utils import timezone

    with time_machine.travel(timezone.now() + dt.timedelta(seconds=LEASE + 1)):
        taker = claim()
    assert isinstance(taker, store.Claim) and taker.taken_over
