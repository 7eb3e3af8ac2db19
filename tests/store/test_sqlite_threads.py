"""SQLite, one process, many threads: the same once-only guarantee (docs/storage.md).

SQLite has one writer at a time, so claims of a new key queue on its lock instead of
racing; the outcome must still be one execution, every other answer a 409 or a replay.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from django_idempotency import inbox
from django_idempotency.exceptions import InFlight
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)


def test_16_threads_one_execution():
    token = TokenFactory(user__username="sqlite-racer").key
    for _ in range(5):
        key = str(uuid.uuid4())
        barrier = threading.Barrier(16)
        runner = Runner()

        def client():
            barrier.wait(10)
            return token_client(token).post(
                "/widgets", {"name": "t", "size": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key
            )

        for _ in range(16):
            runner.start(client)
        results = runner.join()
        statuses = sorted(r.status_code for r in results)
        assert Widget.objects.filter(name="t").count() == 1, statuses
        fresh = [r for r in results if r.status_code == 201 and "Idempotent-Replayed" not in r]
        assert len(fresh) == 1, statuses
        assert all(r.status_code in (201, 409) for r in results), statuses
        assert IdempotencyRecord.objects.get(key=key).state == RecordState.COMPLETED
        Widget.objects.all().delete()


# SQLite has one write lock, held by a view's transaction from its first write to its
# commit. A duplicate of a held key only reads it, so it answers at once instead of
# queueing for that lock; and, holding no lock itself, it cannot fail a view that reads
# before it writes (https://www.sqlite.org/lang_transaction.html).


def test_a_duplicate_of_a_view_that_has_written_gets_409_at_once(gate):
    token = TokenFactory(user__username="sqlite-writer").key
    gate_name, held = gate
    key = str(uuid.uuid4())
    runner = Runner()
    runner.start(
        lambda: token_client(token).post(
            "/widgets",
            {"name": "held", "size": 1},
            format="json",
            HTTP_IDEMPOTENCY_KEY=key,
            HTTP_X_GATE=gate_name,
        )
    )
    assert held.entered.wait(30)  # its Widget is written, its transaction open

    duplicate = token_client(token).post(
        "/widgets", {"name": "held", "size": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    held.opened.set()
    (first,) = runner.join(30)

    assert duplicate.status_code == 409, duplicate.content
    assert first.status_code == 201 and "Idempotent-Replayed" not in first
    assert Widget.objects.filter(name="held").count() == 1


def test_a_duplicate_inbox_call_while_the_body_has_written_is_in_flight_at_once():
    written, finish = threading.Event(), threading.Event()
    outcome: list[object] = []

    def body() -> None:
        with inbox.once("evt-held", principal="consumer", endpoint="held") as attempt:
            if not attempt.done:
                Widget.objects.create(name="inbox-held")
                written.set()
                assert finish.wait(30)
                attempt.result = {"ok": True}

    def duplicate() -> None:
        try:
            with inbox.once("evt-held", principal="consumer", endpoint="held"):
                outcome.append("ran")
        except InFlight as exc:
            outcome.append(exc)

    runner = Runner()
    runner.start(body)
    assert written.wait(30)
    duplicates = Runner()
    duplicates.start(duplicate)
    duplicates.join(30)
    finish.set()
    runner.join(30)

    assert len(outcome) == 1 and isinstance(outcome[0], InFlight), outcome
    assert Widget.objects.filter(name="inbox-held").count() == 1
