"""Concurrent duplicates with real threads and separate connections (docs/protocol.md).

Every test runs on each kind of record table (``record_table``): on PostgreSQL the
plain table (``PARTITION_RECORDS = False``) and the day-partitioned one; the store-level
races also on SQLite, where threads of one process still race. Requests held inside
the view run on PostgreSQL only: SQLite serialises writers on one lock, so a view
holding a write transaction blocks every other writer instead of racing it (see
docs/storage.md). Rounds are repeated to catch races; ``--stress`` repeats them many
more times.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from django.db import transaction

from django_idempotency import store, testing
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import GATES, HOOKS, Gate
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]
pg_only = pytest.mark.postgres

CLIENTS = 16


def rounds(request: pytest.FixtureRequest, default: int, stress: int) -> int:
    if not request.config.getoption("--stress"):
        return default
    return max(default, round(stress * request.config.getoption("--stress-scale")))


@pytest.fixture
def token():
    return TokenFactory(user__username="racer").key


def _post(token_key, url, body, key, **extra):
    return token_client(token_key).post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


@pg_only
def test_16_duplicates_while_the_first_is_held_mid_flight(record_table, request, token):
    for _ in range(rounds(request, 3, 30)):
        key, gate_name = str(uuid.uuid4()), uuid.uuid4().hex
        gate = GATES[gate_name] = Gate()
        barrier = threading.Barrier(CLIENTS)
        runner = Runner()

        def client():
            barrier.wait(10)
            return _post(token, "/slow", {"name": "held"}, key, HTTP_X_GATE=gate_name)

        for _ in range(CLIENTS):
            runner.start(client)
        assert gate.entered.wait(30), "no request reached the view"
        # Every duplicate answers while the owner is still held at the gate.
        deadline = time.monotonic() + 60
        while len(runner.results) < CLIENTS - 1:  # threads stay connected: count answers
            assert time.monotonic() < deadline, "the duplicates did not all answer"
            time.sleep(0.05)
        early = list(runner.results)
        assert len(early) == CLIENTS - 1
        assert all(r.status_code == 409 for r in early), [r.status_code for r in early]
        assert all(r["Retry-After"] for r in early)
        gate.opened.set()
        results = runner.join()
        assert sorted(r.status_code for r in results) == [201] + [409] * (CLIENTS - 1)
        assert gate.calls == 1
        assert Widget.objects.filter(name="held").count() == 1
        replay = _post(token, "/slow", {"name": "held"}, key)
        assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
        Widget.objects.all().delete()
        del GATES[gate_name]


@pg_only
def test_16_simultaneous_duplicates_execute_once(record_table, request, token):
    for _ in range(rounds(request, 10, 200)):
        key = str(uuid.uuid4())
        barrier = threading.Barrier(CLIENTS)
        runner = Runner()

        def client():
            barrier.wait(10)
            return _post(token, "/widgets", {"name": "race", "size": 1}, key)

        for _ in range(CLIENTS):
            runner.start(client)
        results = runner.join()
        assert Widget.objects.filter(name="race").count() == 1
        fresh = [r for r in results if r.status_code == 201 and "Idempotent-Replayed" not in r]
        replays = [r for r in results if r.status_code == 201 and "Idempotent-Replayed" in r]
        conflicts = [r for r in results if r.status_code == 409]
        assert len(fresh) == 1
        assert len(fresh) + len(replays) + len(conflicts) == CLIENTS
        assert all(r.content == fresh[0].content for r in replays)
        assert IdempotencyRecord.objects.get(key=key).state == RecordState.COMPLETED
        Widget.objects.all().delete()


def test_concurrent_takeover_of_an_expired_lease_has_one_winner(record_table, request):
    for n in range(rounds(request, 10, 200)):
        scope = store.Scope("auth.user:1", "POST /t", f"k{n}")
        store.claim(scope, "f" * 64, lease=5, retention=60)
        barrier = threading.Barrier(CLIENTS)
        runner = Runner()

        def contender():
            barrier.wait(10)
            return store.claim(scope, "f" * 64, lease=5, retention=60)

        with testing.travel(10):
            for _ in range(CLIENTS):
                runner.start(contender)
            results = runner.join()
        winners = [r for r in results if isinstance(r, store.Claim)]
        assert len(winners) == 1 and winners[0].taken_over
        assert all(isinstance(r, store.Existing) for r in results if r not in winners)
        record = IdempotencyRecord.objects.get(key=f"k{n}")
        assert record.owner_token == winners[0].owner_token


def test_concurrent_reuse_after_retention_has_one_winner(request, record_table):
    for n in range(rounds(request, 5, 100)):
        scope = store.Scope("auth.user:1", "POST /t", f"old{n}")
        won = store.claim(scope, "f" * 64, lease=5, retention=60)
        with transaction.atomic():
            store.complete(won, store.StoredResponse(200, [], b"old"))
        barrier = threading.Barrier(CLIENTS)
        runner = Runner()

        def contender():
            barrier.wait(10)
            return store.claim(scope, "e" * 64, lease=5, retention=60)

        with testing.travel(61):
            for _ in range(CLIENTS):
                runner.start(contender)
            results = runner.join()
        winners = [r for r in results if isinstance(r, store.Claim)]
        assert len(winners) == 1, results
        record = IdempotencyRecord.objects.get(key=f"old{n}")
        assert record.owner_token == winners[0].owner_token and record.fingerprint == "e" * 64


@pg_only
def test_stale_owner_is_fenced_and_rolled_back_over_http(record_table, token, gate):
    gate_name, held = gate
    key = str(uuid.uuid4())
    runner = Runner()
    runner.start(lambda: _post(token, "/slow", {"name": "x"}, key, HTTP_X_GATE=gate_name))
    assert held.entered.wait(30)
    with testing.travel(10):  # /slow has a 5 s lease: it ran out
        second = _post(token, "/slow", {"name": "x"}, key)
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    held.opened.set()
    (first,) = runner.join()
    assert first.status_code == 409
    assert json.loads(first.content)["type"].endswith("lease-lost")
    assert Widget.objects.count() == 1  # the stale owner's write was rolled back
    replay = _post(token, "/slow", {"name": "x"}, key)
    assert replay.content == second.content and replay["Idempotent-Replayed"] == "true"


@pg_only
def test_heartbeat_keeps_a_long_handler_from_being_taken_over(record_table, token, gate):
    gate_name, held = gate
    key = str(uuid.uuid4())
    runner = Runner()
    runner.start(lambda: _post(token, "/heartbeat", {}, key, HTTP_X_GATE=gate_name))
    assert held.entered.wait(30)
    with testing.travel(30):  # past the 5 s lease, inside the 60 s heartbeat
        duplicate = _post(token, "/heartbeat", {}, key)
    assert duplicate.status_code == 409
    held.opened.set()
    (first,) = runner.join()
    assert first.status_code == 201 and json.loads(first.content) == {"extended": True}
    assert Widget.objects.count() == 1


@pg_only
def test_the_claim_commits_before_the_view_runs(record_table, token):
    key = str(uuid.uuid4())
    seen: list[str] = []

    def look_from_another_connection(request):
        runner = Runner()
        runner.start(lambda: IdempotencyRecord.objects.get(key=key).state)
        seen.extend(runner.join())

    HOOKS["during_view"] = look_from_another_connection
    assert _post(token, "/slow", {"name": "c"}, key).status_code == 201
    assert seen == [RecordState.CLAIMED]


@pg_only
def test_bounded_wait_replays_instead_of_409(record_table, token, gate, monkeypatch):
    gate_name, held = gate
    key = str(uuid.uuid4())
    polled = threading.Event()
    real_claim = store.claim

    def spying_claim(*args, **kwargs):
        result = real_claim(*args, **kwargs)
        if isinstance(result, store.Existing) and not result.completed:
            polled.set()  # the duplicate found the original in flight and waits
        return result

    monkeypatch.setattr(store, "claim", spying_claim)
    runner = Runner()
    runner.start(lambda: _post(token, "/waiting", {}, key, HTTP_X_GATE=gate_name))
    assert held.entered.wait(30)
    waiter = Runner()
    waiter.start(lambda: _post(token, "/waiting", {}, key))
    assert polled.wait(30)
    held.opened.set()
    (first,) = runner.join()
    (second,) = waiter.join()
    assert first.status_code == 201
    assert second.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert second.content == first.content
    assert Widget.objects.filter(name="waiting").count() == 1


@pg_only
def test_a_released_claim_lets_a_waiting_duplicate_run(record_table, token, gate, monkeypatch):
    """The original fails (5xx, released) while a duplicate waits: the duplicate runs."""
    gate_name, held = gate
    key = str(uuid.uuid4())
    waiting = threading.Event()
    real_claim = store.claim

    def spying_claim(*args, **kwargs):
        result = real_claim(*args, **kwargs)
        if isinstance(result, store.Existing) and not result.completed:
            waiting.set()  # the duplicate found the original in flight: it waits
        return result

    monkeypatch.setattr(store, "claim", spying_claim)

    def fail_once(request):
        if request.headers.get("X-Gate"):
            GATES[gate_name].pass_through()
            raise RuntimeError("first attempt fails")

    HOOKS["during_view"] = fail_once
    runner = Runner()
    runner.start(lambda: _post(token, "/waiting", {}, key, HTTP_X_GATE=gate_name))
    assert held.entered.wait(30)
    waiter = Runner()
    waiter.start(lambda: _post(token, "/waiting", {}, key))
    assert waiting.wait(30), "the duplicate never saw the original in flight"
    held.opened.set()
    (first,) = runner.join()
    (second,) = waiter.join()
    assert first.status_code == 500
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    assert Widget.objects.filter(name="waiting").count() == 1
