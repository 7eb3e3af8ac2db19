"""The outbox's default dedup keys: one per execution, so a key reused after its
retention window gets a message of its own, and the keys of phases never collide."""

from __future__ import annotations

import uuid

import pytest

from django_idempotency import store
from django_idempotency.models import IdempotencyRecord, OutboxMessage
from django_idempotency.testing import travel
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_key_reused_after_its_retention_window_gets_its_own_outbox_message():
    """A key reused past the view's retention window is a new request: its execution
    enqueues a message of its own (its default dedup key differs), and the expired
    record made way for the new one."""
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
    """Phase ``a:b`` enqueueing to topic ``c`` and phase ``a`` enqueueing to ``b:c`` get
    different default dedup keys: the separator in names never makes two keys equal."""
    scope = store.Scope("auth.user:1", "POST /x", "k")
    won = store.claim(scope, "f" * 64, lease=30, retention=60)
    from django_idempotency.protocol.context import IdempotencyContext

    context = IdempotencyContext(won, lease=30, phases=("a:b", "a"))
    context.open_phase = "a:b"
    one = context.next_outbox_key("c")
    context.open_phase = "a"
    other = context.next_outbox_key("b:c")
    assert one != other
