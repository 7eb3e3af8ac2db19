"""The relay's lease on the messages it claimed: a slow handler does not make what was
delivered before it claimable again, and a message whose handler kills the relay is
dead-lettered after ``OUTBOX_MAX_ATTEMPTS`` runs."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_idempotency import outbox, signals
from django_idempotency.conf import conf
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel

pytestmark = pytest.mark.django_db(transaction=True)


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
    """A handler that kills its relay (``SystemExit``: a hard time limit, OOM) never reports
    back; each run after the lease counts an attempt, and after ``OUTBOX_MAX_ATTEMPTS``
    the message is dead-lettered, not retried for ever."""

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
