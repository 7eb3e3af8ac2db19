"""Regressions found by an adversarial review of phases, the outbox and the relay."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connections, transaction

from django_idempotency import outbox, signals, store
from django_idempotency.conf import conf
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_key_reused_after_its_retention_window_gets_its_own_outbox_message():
    client = token_client(TokenFactory(user__username="shipper").key)
    key = str(uuid.uuid4())
    first = client.post("/ship", {"what": "first"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201
    with travel(120):  # past the view's 60 s retention: the key is new (docs/retention.md)
        second = client.post("/ship", {"what": "second"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    payloads = sorted(m["what"] for m in OutboxMessage.objects.values_list("payload", flat=True))
    assert payloads == ["first", "second"]
    assert IdempotencyRecord.objects.count() == 1  # the expired record made way


def test_the_default_outbox_keys_of_two_phase_topic_pairs_never_collide():
    scope = store.Scope("auth.user:1", "POST /x", "k")
    won = store.claim(scope, "f" * 64, lease=30, retention=60)
    from django_idempotency.protocol.context import IdempotencyContext

    context = IdempotencyContext(won, lease=30, phases=("a:b", "a"))
    context.open_phase = "a:b"
    one = context.next_outbox_key("c")
    context.open_phase = "a"
    other = context.next_outbox_key("b:c")
    assert one != other


def test_a_slow_handler_does_not_make_delivered_messages_claimable_again():
    """Relay A delivers messages 0 and 1, then its handler of message 2 blocks past A's
    lease. The marks of 0 and 1 are committed while it blocks (their group's deadline,
    ``OUTBOX_MARK_DELAY``, is far inside the lease: the watchdog writes them), so
    relay B, once A's lease ran out, delivers only message 2 again."""
    entered, proceed, marked = threading.Event(), threading.Event(), threading.Event()
    seen: list[tuple[str, int]] = []
    ids: dict[int, int] = {}
    committed: set[int] = set()

    def handler(message, dedup_key):
        who = threading.current_thread().name
        seen.append((who, message.payload["n"]))
        if message.payload["n"] == 2 and who == "A":
            entered.set()
            proceed.wait(30)  # the last handler of relay A's batch is slow

    def on_delivered(sender, message_id, **kwargs):
        committed.add(message_id)
        if {ids[0], ids[1]} <= committed:
            marked.set()

    outbox.register("tests.slow")(handler)
    signals.outbox_delivered.connect(on_delivered)
    try:
        with transaction.atomic():
            for n in range(3):
                ids[n] = outbox.enqueue("tests.slow", {"n": n}).pk

        def relay_a():
            try:
                relay.deliver_batch(10, lease=2.0)
            finally:
                connections.close_all()

        thread = threading.Thread(target=relay_a, name="A")
        thread.start()
        assert entered.wait(30)
        # Before the fix, nothing marked them before the slow handler returned.
        assert marked.wait(30), "messages 0 and 1 not marked sent while handler 2 blocks"
        with travel(3):  # relay A's lease ran out while its third handler still runs
            relay.deliver_batch(10, lease=30.0)
        proceed.set()
        thread.join(30)
        assert not thread.is_alive(), "relay A did not finish"
        delivered_again = [n for who, n in seen if who != "A"]
        assert delivered_again == [2], seen
    finally:
        proceed.set()
        signals.outbox_delivered.disconnect(on_delivered)
        outbox.unregister("tests.slow")


def test_a_message_that_kills_its_relay_is_dead_lettered_after_max_attempts():
    def poison(message, dedup_key):
        raise SystemExit("the worker is killed (a hard time limit, OOM)")

    outbox.register("tests.poison")(poison)
    try:
        with transaction.atomic():
            outbox.enqueue("tests.poison", {})
        kills = 0
        for i in range(conf.outbox_max_attempts + 3):  # each run starts after the lease
            with travel((i + 1) * (conf.outbox_relay_lease + 1)):
                try:
                    relay.deliver_batch(10)
                except SystemExit:
                    kills += 1
        assert kills == conf.outbox_max_attempts  # then it was buried, not retried
        message = OutboxMessage.objects.get(topic="tests.poison")
        assert message.state == OutboxState.DEAD
        assert message.attempts == conf.outbox_max_attempts
        assert "never reported back" in message.last_error
    finally:
        outbox.unregister("tests.poison")


def test_a_phased_view_with_an_optional_key_runs_unprotected_without_one():
    client = token_client(TokenFactory(user__username="phaser").key)
    response = client.post("/phased-optional", {}, format="json")
    assert response.status_code == 201, response.content
    assert Widget.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 0
    keyed = client.post("/phased-optional", {}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = client.post("/phased-optional", {}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert keyed.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 4


def test_release_never_deletes_a_record_whose_phase_committed():
    scope = store.Scope("auth.user:1", "POST /x", "phase-committed")
    won = store.claim(scope, "f" * 64, lease=30, retention=60)
    with transaction.atomic():
        store.advance(won, "a")  # committed, though the caller may not have heard it
    assert store.release(won) is False
    assert IdempotencyRecord.objects.get().recovery_point == "a"
