"""The outbox store's contract, the same for each implementation (``store.outbox``).

On PostgreSQL both implementations run (the portable one is plain ORM and works there
too), so the two are held to one set of outcomes; on SQLite the portable one. What the
relay makes of the answers (marks in groups, the lease keeper, dead letters reported)
is tested in tests/outbox.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from django.db import connection

from django_idempotency import testing
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.store import clock
from django_idempotency.store.outbox import (
    ABANDONED,
    OutboxStore,
    PortableOutbox,
    PostgresOutbox,
    outbox_store,
)

pytestmark = pytest.mark.django_db

LEASE = 30.0


@pytest.fixture(params=["portable", "postgresql"])
def kind(request: pytest.FixtureRequest) -> Iterator[OutboxStore]:
    if request.param == "postgresql" and connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's outbox statements need PostgreSQL")
    yield PortableOutbox("default") if request.param == "portable" else PostgresOutbox("default")


def put(store: OutboxStore, topic: str, dedup_key: str, **extra: object) -> OutboxMessage:
    fields = {"topic": topic, "payload": {"n": dedup_key}, "dedup_key": dedup_key}
    return store.insert({**fields, "record_id": None, **extra}, None)


def test_each_database_gets_its_own_kind_of_store():
    expected = PostgresOutbox if connection.vendor == "postgresql" else PortableOutbox
    assert type(outbox_store("default")) is expected
    assert outbox_store("default").concurrent_writers is (connection.vendor == "postgresql")


def test_an_insert_with_a_known_dedup_key_returns_the_message_it_names(kind):
    first = put(kind, "t.a", "k1")
    again = kind.insert({"topic": "t.a", "payload": {"other": 1}, "dedup_key": "k1",
                         "record_id": None}, None)  # fmt: skip
    assert again.pk == first.pk and again.payload == {"n": "k1"}
    assert OutboxMessage.objects.filter(topic="t.a").count() == 1
    assert first.state == OutboxState.PENDING and first.attempts == 0


def test_a_message_due_later_is_not_claimed_before_then(kind):
    later = clock.app_now() + dt.timedelta(hours=1)
    kind.insert({"topic": "t.b", "payload": {}, "dedup_key": "k", "record_id": None}, later)
    assert kind.claim_due(10, LEASE, 5) == ([], [])
    with testing.travel(3601):
        claimed, _ = kind.claim_due(10, LEASE, 5)
    assert [c.message.topic for c in claimed] == ["t.b"]


def test_a_claim_takes_the_oldest_due_first_counts_an_attempt_and_leases_them(kind):
    for n in range(3):
        put(kind, "t.c", f"k{n}")
    claimed, buried = kind.claim_due(2, LEASE, 5)
    assert buried == []
    assert [c.message.dedup_key for c in claimed] == ["k0", "k1"]
    assert all(c.message.attempts == 1 for c in claimed)
    assert all(c.age >= 0 for c in claimed)
    stored = OutboxMessage.objects.get(pk=claimed[0].message.pk)
    assert stored.attempts == 1 and stored.available_at > clock.app_now() + dt.timedelta(seconds=20)
    # Leased: the next claim gets only the third.
    again, _ = kind.claim_due(10, LEASE, 5)
    assert [c.message.dedup_key for c in again] == ["k2"]


def test_a_claim_dead_letters_a_message_whose_last_attempt_never_reported_back(kind):
    put(kind, "t.d", "k")
    first, _ = kind.claim_due(10, LEASE, 1)
    assert len(first) == 1
    with testing.travel(LEASE + 1):
        claimed, buried = kind.claim_due(10, LEASE, 1)
    assert claimed == [] and [(b.topic, b.attempts) for b in buried] == [("t.d", 1)]
    message = OutboxMessage.objects.get(pk=first[0].message.pk)
    assert message.state == OutboxState.DEAD
    assert message.last_error == ABANDONED.format(attempts=1)


def test_a_mark_is_written_while_the_claim_holds_and_refused_after_a_takeover(kind):
    put(kind, "t.e", "mine")
    put(kind, "t.e", "lost")
    claimed, _ = kind.claim_due(10, LEASE, 5)
    mine, lost = claimed
    with testing.travel(LEASE + 1):
        # Another relay claims both once the lease ran out; only "mine" was marked before.
        assert kind.write_sent([mine]) == {mine.message.pk}
        retaken, _ = kind.claim_due(10, LEASE, 5)
        assert [c.message.pk for c in retaken] == [lost.message.pk]
        assert kind.write_sent([lost]) == set()
    states = dict(OutboxMessage.objects.values_list("dedup_key", "state"))
    assert states == {"mine": OutboxState.SENT, "lost": OutboxState.PENDING}
    assert kind.write_sent([]) == set()


def test_a_renewal_moves_the_lease_later_and_skips_a_message_taken_over(kind):
    put(kind, "t.f", "held")
    put(kind, "t.f", "kept")
    claimed, _ = kind.claim_due(10, LEASE, 5)
    held, kept = claimed
    renewed = kind.renew([kept], 2 * LEASE)
    end = OutboxMessage.objects.get(pk=kept.message.pk).available_at
    assert renewed == {kept.message.pk: end} and end > kept.message.available_at
    with testing.travel(LEASE + 1):
        # "held"'s lease ran out and another relay claimed it; "kept"'s still runs.
        retaken, _ = kind.claim_due(10, LEASE, 5)
        assert [c.message.pk for c in retaken] == [held.message.pk]
        assert kind.renew([held, kept], 2 * LEASE).keys() == {kept.message.pk}
        assert kind.renew(retaken, 2 * LEASE).keys() == {held.message.pk}
    assert kind.renew([], LEASE) == {}


def test_a_fence_compares_lease_ends_as_instants_whatever_the_claims_time_zone(kind):
    """A claim's lease end handed back in another time zone is the same fence."""
    put(kind, "t.g", "k")
    (item,), _ = kind.claim_due(10, LEASE, 5)
    shifted = item.message.available_at.astimezone(dt.timezone(dt.timedelta(hours=-7)))
    item.message.available_at = shifted
    as_claimed = SimpleNamespace(message=item.message)
    assert kind.write_sent([as_claimed]) == {item.message.pk}
