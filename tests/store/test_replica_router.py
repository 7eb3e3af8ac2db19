"""Primary only: with a router that sends reads to a replica, the records stay on the primary.

The ``replica`` alias (tests/settings.py) is a second real PostgreSQL database, migrated,
holding stale copies of records and messages, as a lagging replica would. The router
sends every read there and every write to ``default``: claims, look-ups, replays,
heartbeats, phases, the relay and the sweeper must all ignore it (docs/deployment.md).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from django.db import transaction
from django.test import RequestFactory
from rest_framework.test import APIClient

from django_idempotency import outbox, retention, store, testing
from django_idempotency.admin import OutboxMessageAdmin
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from tests.support.factories import UserFactory
from tests.support.testapp.models import Widget

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "replica"]),
    pytest.mark.pooled,
]

DAY = 86400.0


class ReplicaRouter:
    """Reads from ``replica``, writes to ``default``: a read-replica deployment."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "replica"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True


@pytest.fixture
def user() -> Any:
    return UserFactory(username="topology")


@pytest.fixture
def routed(settings: Any) -> None:
    settings.DATABASE_ROUTERS = ["tests.store.test_replica_router.ReplicaRouter"]


@pytest.fixture
def client(user: Any) -> APIClient:
    # Authenticated directly: token authentication would read the token from the replica.
    api = APIClient()
    api.force_authenticate(user)
    return api


def scope_of(user: Any, endpoint: str, key: str) -> store.Scope:
    return store.Scope(f"auth.user:{user.pk}", endpoint, key)


def stale_claim(scope: store.Scope, fingerprint: str = "0" * 64) -> store.Claim:
    """A claimed record with a live lease, on the replica only."""
    won = store.claim(scope, fingerprint, lease=600, retention=DAY, using="replica")
    assert isinstance(won, store.Claim)
    return won


def post(client: APIClient, path: str, key: str, body: Any) -> Any:
    return client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_retry_replays_from_the_primary_while_the_replica_shows_it_in_flight(
    routed, client, user
):
    key = str(uuid.uuid4())
    first = post(client, "/widgets", key, {"name": "a", "size": 1})
    assert first.status_code == 201
    stale_claim(scope_of(user, "POST /widgets", key))  # the replica lags: still claimed

    again = post(client, "/widgets", key, {"name": "a", "size": 1})

    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert Widget.objects.using("default").count() == 1


def test_a_key_the_primary_does_not_know_runs_whatever_the_replica_holds(routed, client, user):
    key = str(uuid.uuid4())
    stale = stale_claim(scope_of(user, "POST /widgets", key))
    with transaction.atomic(using="replica"):
        store.complete(stale, store.StoredResponse(200, [], b'{"stale": true}'))

    response = post(client, "/widgets", key, {"name": "b", "size": 2})

    assert response.status_code == 201 and "Idempotent-Replayed" not in response
    assert Widget.objects.using("default").count() == 1
    record = IdempotencyRecord.objects.using("default").get(key=key)
    assert record.state == "completed" and record.response_status == 201


def test_heartbeats_and_phases_run_on_the_primary(routed, client, user):
    key = str(uuid.uuid4())
    stale_claim(scope_of(user, "POST /heartbeat", key))
    beat = post(client, "/heartbeat", key, {})
    assert beat.status_code == 201 and beat.json() == {"extended": True}

    phased = str(uuid.uuid4())
    stale = stale_claim(scope_of(user, "POST /phased-optional", phased))
    first = post(client, "/phased-optional", phased, {})
    assert first.status_code == 201
    record = IdempotencyRecord.objects.using("default").get(key=phased)
    assert record.state == "completed" and record.recovery_point == "b"
    again = post(client, "/phased-optional", phased, {})
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.using("default").filter(name="phase-a").count() == 1
    untouched = IdempotencyRecord.objects.using("replica").get(pk=stale.record_id)
    assert untouched.state == "claimed" and untouched.recovery_point == ""


@pytest.fixture
def deliveries() -> Any:
    seen: list[tuple[int, str]] = []
    outbox.register("topology.topic")(lambda message, key: seen.append((message.pk, key)))
    yield seen
    outbox.unregister("topology.topic")


def test_the_relay_claims_and_marks_on_the_primary(routed, deliveries, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    with transaction.atomic(using="default"):
        sent = outbox.enqueue("topology.topic", {"n": 0}, dedup_key="sent-on-primary")
        pending = outbox.enqueue("topology.topic", {"n": 1}, dedup_key="pending-on-primary")
    OutboxMessage.objects.using("default").filter(pk=sent.pk).update(state=OutboxState.SENT)
    with transaction.atomic(using="replica"):  # the replica still shows it pending
        outbox.enqueue("topology.topic", {"n": 0}, dedup_key="sent-on-primary", using="replica")

    assert relay.deliver_batch() == 1

    assert deliveries == [(pending.pk, "pending-on-primary")]
    assert OutboxMessage.objects.using("default").get(pk=pending.pk).state == OutboxState.SENT
    assert set(OutboxMessage.objects.using("replica").values_list("state", flat=True)) == {
        OutboxState.PENDING
    }


def test_the_sweeper_sweeps_the_primary(routed, user):
    old_primary = scope_of(user, "POST /widgets", str(uuid.uuid4()))
    old_replica = scope_of(user, "POST /widgets", str(uuid.uuid4()))
    with testing.travel(-10 * DAY):
        won = store.claim(old_primary, "1" * 64, lease=30, retention=DAY)
        assert isinstance(won, store.Claim)
        stale_claim(old_replica)

    report = retention.sweep()

    assert report.database == "default" and not report.errors
    assert not IdempotencyRecord.objects.using("default").filter(pk=won.record_id).exists()
    assert IdempotencyRecord.objects.using("replica").filter(key=old_replica.key).exists()


def test_the_admin_retry_action_kicks_the_relay_of_the_primary(routed, monkeypatch):
    with transaction.atomic(using="default"):
        message = outbox.enqueue("topology.topic", {}, dedup_key="dead-one")
    OutboxMessage.objects.using("default").filter(pk=message.pk).update(state=OutboxState.DEAD)
    kicked: list[str | None] = []
    monkeypatch.setattr(outbox, "kick", lambda using=None: kicked.append(using) or True)
    admin = OutboxMessageAdmin(OutboxMessage, None)  # type: ignore[arg-type]
    monkeypatch.setattr(admin, "message_user", lambda *args, **kwargs: None)

    # The changelist's queryset: read through the router (here, from the replica).
    admin.retry_dead(RequestFactory().post("/"), OutboxMessage.objects.filter(pk=message.pk))

    retried = OutboxMessage.objects.using("default").get(pk=message.pk)
    assert retried.state == OutboxState.PENDING and retried.attempts == 0
    assert retried.available_at <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    assert kicked == ["default"]


def test_the_admin_lease_and_forget_actions_write_on_the_primary(routed, user, monkeypatch):
    from django_idempotency.admin import IdempotencyRecordAdmin

    live = store.claim(scope_of(user, "POST /x", "live"), "a" * 64, lease=600, retention=DAY)
    done = store.claim(scope_of(user, "POST /x", "done"), "a" * 64, lease=600, retention=DAY)
    assert isinstance(live, store.Claim) and isinstance(done, store.Claim)
    with transaction.atomic(using="default"):
        store.complete(done, store.StoredResponse(201, [], b"{}"))
    for won in (live, done):  # the replica holds copies, as a real one would
        copy = IdempotencyRecord.objects.using("default").get(pk=won.record_id)
        copy.save(using="replica", force_insert=True)
    admin = IdempotencyRecordAdmin(IdempotencyRecord, None)  # type: ignore[arg-type]
    monkeypatch.setattr(admin, "message_user", lambda *args, **kwargs: None)
    confirmed = RequestFactory().post("/", {"post": "yes"})

    # The changelist's querysets read through the router: from the replica.
    admin.end_leases(confirmed, IdempotencyRecord.objects.filter(pk=live.record_id))
    admin.forget_responses(confirmed, IdempotencyRecord.objects.filter(pk=done.record_id))

    retry = store.claim(live.scope, "a" * 64, lease=600, retention=DAY)
    assert isinstance(retry, store.Claim) and retry.taken_over  # the primary's lease ended
    assert not IdempotencyRecord.objects.using("default").filter(pk=done.record_id).exists()
    assert IdempotencyRecord.objects.using("replica").filter(pk=done.record_id).exists()
