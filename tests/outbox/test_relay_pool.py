"""Handlers in a thread pool (``threads``, ``OUTBOX_RELAY_THREADS``, ``--threads``):
real threads, each with its own database connection, on any database."""

from __future__ import annotations

import io
import threading
from collections import Counter
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections, transaction

from django_idempotency import outbox
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]


class Pooled:
    """A handler that records (thread, message id, dedup key); the first ``together``
    calls wait at a barrier, so the test passes only if they run at the same time."""

    def __init__(self, together: int = 0, fail: set[int] | None = None) -> None:
        self.seen: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(together, timeout=30) if together else None
        self.waited = 0
        self.fail = fail or set()
        self.wrappers: list[Any] = []

    def __call__(self, message: OutboxMessage, dedup_key: str) -> None:
        with self.lock:
            self.seen.append((threading.current_thread().name, message.pk, dedup_key))
            wait = self.barrier is not None and self.waited < self.barrier.parties
            self.waited += 1
        if wait:
            assert self.barrier is not None
            self.barrier.wait()
        # The handler uses the ORM: on its thread's own connection.
        assert OutboxMessage.objects.filter(pk=message.pk).exists()
        with self.lock:
            self.wrappers.append(connections["default"])
        if message.payload["n"] in self.fail:
            raise RuntimeError(f"handler failed on {message.payload['n']}")


@pytest.fixture
def pooled() -> Any:
    made: list[Pooled] = []

    def make(**kwargs: Any) -> Pooled:
        made.append(Pooled(**kwargs))
        outbox.unregister("pool.topic")
        outbox.register("pool.topic")(made[-1])
        return made[-1]

    yield make
    for handler in made:
        if handler.barrier is not None:
            handler.barrier.abort()
    outbox.unregister("pool.topic")


def enqueue(n: int) -> list[OutboxMessage]:
    with transaction.atomic():
        return [outbox.enqueue("pool.topic", {"n": i}) for i in range(n)]


def test_handlers_run_at_the_same_time_each_message_once(pooled, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    handler = pooled(together=4)
    messages = enqueue(40)
    assert relay.deliver_batch(40, threads=4) == 40
    counts = Counter(pk for _thread, pk, _key in handler.seen)
    assert set(counts) == {m.pk for m in messages} and set(counts.values()) == {1}
    assert {(pk, key) for _t, pk, key in handler.seen} == {(m.pk, m.dedup_key) for m in messages}
    threads = {thread for thread, _pk, _key in handler.seen}
    assert len(threads) == 4 and threading.current_thread().name not in threads
    states = OutboxMessage.objects.values_list("state", "attempts").distinct()
    assert list(states) == [(OutboxState.SENT, 1)]


def test_pool_threads_close_their_connections(pooled, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    handler = pooled()
    enqueue(8)
    assert relay.deliver_batch(8, threads=2) == 8
    wrappers = {id(w): w for w in handler.wrappers}.values()
    assert len(wrappers) == 2  # one per pool thread, not the relay's
    assert connections["default"] not in wrappers
    assert all(w.connection is None for w in wrappers)  # closed when the pool ended


def test_a_failing_handler_in_the_pool_is_retried_the_others_are_sent(pooled, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    pooled(fail={3})
    messages = enqueue(6)
    assert relay.deliver_batch(10, threads=3) == 6
    failed = OutboxMessage.objects.get(pk=messages[3].pk)
    assert failed.state == OutboxState.PENDING and "handler failed on 3" in failed.last_error
    others = OutboxMessage.objects.exclude(pk=messages[3].pk)
    assert set(others.values_list("state", flat=True)) == {OutboxState.SENT}


def test_the_pool_hands_back_what_it_did_not_start_after_half_the_lease(pooled, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    handler = pooled()
    enqueue(5)
    assert relay.deliver_batch(10, lease=0.0, threads=3) == 0  # no time left
    assert handler.seen == []
    assert set(OutboxMessage.objects.values_list("state", "attempts")) == {(OutboxState.PENDING, 0)}
    assert relay.deliver_batch(10, threads=3) == 5


def test_the_setting_and_the_command_flag_choose_the_pool(pooled, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_RELAY_THREADS": 2}
    handler = pooled(together=2)
    enqueue(4)
    assert relay.deliver_batch(10) == 4  # two at a time, or the barrier breaks
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    handler = pooled(together=3)
    enqueue(6)
    out = io.StringIO()
    call_command("idempotency_relay", "--once", "--threads", "3", stdout=out)
    assert (
        out.getvalue()
        == "Handled 6 outbox messages.\n6 delivered, 0 failed (retried later), 0 dead-lettered.\n"
    )
    assert len({thread for thread, _pk, _key in handler.seen}) == 3


def test_inside_a_transaction_handlers_run_one_by_one(pooled, settings):
    """Pool threads could not see the claim of an open transaction: no pool there."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    handler = pooled()
    enqueue(3)
    with transaction.atomic():
        assert relay.deliver_batch(10, threads=4) == 3
    assert {thread for thread, _pk, _key in handler.seen} == {threading.current_thread().name}


def test_threads_below_one_are_refused():
    with pytest.raises(ValueError):
        relay.deliver_batch(10, threads=0)
