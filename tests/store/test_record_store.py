"""The record store's contract, the same for each implementation (``store.records``).

On PostgreSQL both implementations run (the portable one is plain ORM and works there
too), so the two are held to one set of outcomes; on SQLite the portable one. What a
record means for a request is ``store.claims.judge``'s (tests/store/test_judge.py);
what the protocol makes of the answers is tested in tests/protocol.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, transaction

from django_idempotency import store, testing
from django_idempotency.exceptions import LeaseLost
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store.records import (
    PortableRecords,
    PostgresRecords,
    RecordStore,
    record_store,
)

pytestmark = pytest.mark.django_db

LEASE = 30.0
RETENTION = 3600.0
FINGERPRINT = "a" * 64


@pytest.fixture(params=["portable", "postgresql"])
def kind(request: pytest.FixtureRequest) -> Iterator[RecordStore]:
    if request.param == "postgresql" and connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's record statements need PostgreSQL")
    yield PortableRecords("default") if request.param == "portable" else PostgresRecords("default")


def scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /machines", str(uuid.uuid4()))


def insert(kind: RecordStore, where: store.Scope, token: uuid.UUID) -> store.Claim | store.Existing:
    found = kind.insert(
        where, FINGERPRINT, token, lease=LEASE, retention=RETENTION, request_path="/machines"
    )
    assert found is not None  # nothing else writes this scope
    return found


def claimed(kind: RecordStore) -> store.Claim:
    """A new claim, not committed: the test's transaction holds it (as ``store.claim`` marks it)."""
    won = insert(kind, scope(), uuid.uuid4())
    assert isinstance(won, store.Claim)
    return dataclasses.replace(won, committed=False)


def lost(complete: object) -> None:
    """A completion that must raise ``LeaseLost``, in a block of its own that rolls back."""
    with pytest.raises(LeaseLost), transaction.atomic():
        complete()  # type: ignore[operator]


def response(body: bytes = b'{"id": 7}') -> tuple[int, store.Headers, bytes]:
    return 201, [("Content-Type", "application/json")], body


def test_each_database_gets_its_own_kind_of_record_store():
    expected = PostgresRecords if connection.vendor == "postgresql" else PortableRecords
    assert type(record_store("default")) is expected


def test_an_insert_claims_a_new_scope_and_reports_the_record_of_a_taken_one(kind):
    where = scope()
    token = uuid.uuid4()
    won = insert(kind, where, token)
    assert isinstance(won, store.Claim)
    assert (won.scope, won.owner_token, won.taken_over, won.recovery_point) == (
        where,
        token,
        False,
        "",
    )
    found = insert(kind, where, uuid.uuid4())
    assert isinstance(found, store.Existing)
    assert found.record_id == won.record_id and found.owner_token == token
    assert found.state == RecordState.CLAIMED and found.fingerprint == FINGERPRINT
    assert 0 < found.lease_remaining <= LEASE and not found.expired
    assert found.response is None and not found.owner_gone and not found.ended_by_operator


def test_a_completion_stores_the_response_once_and_only_for_its_owner(kind):
    won = claimed(kind)
    kind.complete(won, *response())
    found = store.fetch(won.scope)
    assert found is not None and found.completed
    assert found.response is not None and found.response.status == 201
    assert list(found.response.headers) == [("Content-Type", "application/json")]
    assert bytes(found.response.body) == b'{"id": 7}'
    lost(lambda: kind.complete(won, *response(b"again")))  # completed: no claim to complete
    stranger = claimed(kind)
    impostor = dataclasses.replace(stranger, owner_token=uuid.uuid4())
    lost(lambda: kind.complete(impostor, *response()))
    assert IdempotencyRecord.objects.get(pk=stranger.record_id).state == RecordState.CLAIMED


def test_a_completion_without_a_body_keeps_the_record_and_no_body(kind):
    won = claimed(kind)
    kind.complete(won, 201, [], None)
    record = IdempotencyRecord.objects.get(pk=won.record_id)
    assert record.state == RecordState.COMPLETED and record.response_body is None


def test_a_lease_that_ran_out_is_taken_over_once_and_fences_the_first_owner(kind):
    first = claimed(kind)
    found = insert(kind, first.scope, uuid.uuid4())
    assert isinstance(found, store.Existing)
    # Live: not taken over for the lease.
    assert (
        kind.take_over(first.scope, found, uuid.uuid4(), lease=LEASE, cause=store.BY_LEASE) is None
    )
    with testing.travel(LEASE + 1):
        stale = insert(kind, first.scope, uuid.uuid4())
        assert isinstance(stale, store.Existing) and stale.lease_remaining < 0
        token = uuid.uuid4()
        taken = kind.take_over(first.scope, stale, token, lease=LEASE, cause=store.BY_LEASE)
        assert taken is not None
        second = dataclasses.replace(taken, committed=False)
        assert (second.owner_token, second.taken_over, second.takeover_cause) == (
            token,
            True,
            store.BY_LEASE,
        )
        # The same facts again: the record changed, so a second contender does not win.
        assert (
            kind.take_over(first.scope, stale, uuid.uuid4(), lease=LEASE, cause=store.BY_LEASE)
            is None
        )
        lost(lambda: kind.complete(first, *response(b"first")))
        assert kind.extend(first, 600) is False
        assert kind.release(first) is False
        kind.complete(second, *response(b"second"))
    found = store.fetch(first.scope)
    assert found is not None and found.response is not None
    assert bytes(found.response.body) == b"second"


def test_a_release_deletes_its_own_claim_unless_a_phase_committed(kind):
    won = claimed(kind)
    assert kind.release(won) is True
    assert not IdempotencyRecord.objects.filter(pk=won.record_id).exists()
    assert kind.release(won) is False
    phased = claimed(kind)
    store.advance(phased, "charged")
    assert kind.release(phased) is False
    assert IdempotencyRecord.objects.get(pk=phased.record_id).recovery_point == "charged"


def test_a_heartbeat_moves_the_lease_and_keeps_the_window_past_it(kind):
    won = claimed(kind)
    assert kind.extend(won, 2 * RETENTION) is True
    with testing.travel(RETENTION + LEASE):
        # Past the window the claim was given, the heartbeat's lease still runs.
        found = store.fetch(won.scope)
        assert found is not None and found.lease_remaining > 0 and not found.expired
        assert kind.extend(won, LEASE) is True


def test_a_record_past_its_window_is_forgotten_unless_its_lease_is_live(kind):
    done = claimed(kind)
    kind.complete(done, *response())
    running = claimed(kind)
    assert kind.extend(running, 2 * RETENTION)
    with testing.travel(RETENTION + LEASE + 1):
        for won in (done, running):
            found = store.fetch(won.scope)
            assert found is not None
            kind.forget(found)
    assert not IdempotencyRecord.objects.filter(pk=done.record_id).exists()
    assert IdempotencyRecord.objects.filter(pk=running.record_id).exists()
