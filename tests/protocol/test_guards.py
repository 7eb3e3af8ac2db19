"""Each condition of the protocol, guarded: a test that fails when the condition is removed.

Found by mutation (``make mutation``, docs/testing.md): every test here kills at least
one mutant that the rest of the suite let through. The races are made to happen, not
hoped for: a hook runs the other party (its own thread and database connection)
exactly between a contender's read and its conditional write, or a real row lock holds
a statement at that point (the test polls ``pg_stat_activity``, with a deadline, until
the statement waits for it; nothing else polls or sleeps). Every store-level test runs
on each kind of record table: the plain table (``PARTITION_RECORDS = False``) and the
partitioned one on PostgreSQL, and SQLite.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_idempotency import outbox, store, testing
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.store.records import record_store
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import HOOKS
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db(transaction=True)

FP, OTHER_FP = "a" * 64, "b" * 64
DAY = 86400.0


def scope() -> store.Scope:
    return store.Scope("auth.user:1", "POST /widgets", str(uuid.uuid4()))


def claim(sc: store.Scope, fp: str = FP, *, lease: float = 30, retention_s: float = DAY):
    return store.claim(sc, fp, lease=lease, retention=retention_s)


def done(won: store.Claim, body: bytes = b"{}") -> None:
    with transaction.atomic():
        store.complete(won, store.StoredResponse(201, [], body))


def in_thread(func: Any) -> Any:
    """Run ``func`` in another thread, on that thread's own database connection."""
    runner = Runner()
    runner.start(func)
    (result,) = runner.join(30)
    return result


def before(monkeypatch: pytest.MonkeyPatch, method: str, hook: Any) -> None:
    """Run ``hook()`` each time the record store's ``method`` is about to write."""
    kind = type(record_store("default"))
    real = getattr(kind, method)

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(kind, method, hooked)


def owner_of(sc: store.Scope) -> uuid.UUID:
    return IdempotencyRecord.objects.get(key=sc.key).owner_token


# --- takeover of an expired lease --------------------------------------------------


def test_a_heartbeat_between_the_read_and_the_takeover_keeps_the_owner(record_table, monkeypatch):
    """The contender read an expired lease; the owner's heartbeat lands before the
    contender's UPDATE. The database re-checks the lease: the live owner keeps the key."""
    sc = scope()
    owner = claim(sc)

    def heartbeat() -> None:
        assert in_thread(lambda: store.extend(owner, 600)) is True

    before(monkeypatch, "take_over", heartbeat)
    with testing.travel(31):
        contender = claim(sc)
        assert isinstance(contender, store.Existing), contender
        assert contender.lease_remaining > 0 and contender.owner_token == owner.owner_token
        assert owner_of(sc) == owner.owner_token
        done(owner)  # not fenced off: it still owns the key


def test_a_contender_that_read_before_another_took_over_does_not_win(record_table, monkeypatch):
    """Two contenders read the same expired lease; one takes over between the other's
    read and its UPDATE. Exactly one wins; the loser sees the winner's live claim."""
    sc = scope()
    claim(sc)
    started: list[bool] = []
    winner: list[Any] = []

    def another() -> None:
        if not started:
            started.append(True)
            winner.append(in_thread(lambda: claim(sc)))

    before(monkeypatch, "take_over", another)
    with testing.travel(31):
        loser = claim(sc)
    (first,) = winner
    assert isinstance(first, store.Claim) and first.taken_over
    assert isinstance(loser, store.Existing) and loser.lease_remaining > 0, loser
    assert loser.owner_token == first.owner_token
    assert owner_of(sc) == first.owner_token
    done(first)


def test_a_phase_committed_after_the_read_is_resumed_after_by_the_takeover(
    record_table, monkeypatch
):
    """The owner, past its lease, commits a phase after the contender read the record:
    the takeover must resume after that phase, never run it a second time."""
    sc = scope()
    owner = claim(sc)

    def phase() -> None:
        def advance() -> None:
            with transaction.atomic():
                store.advance(owner, "allocated")

        in_thread(advance)

    before(monkeypatch, "take_over", phase)
    with testing.travel(31):
        contender = claim(sc)
    assert isinstance(contender, store.Claim) and contender.taken_over
    assert contender.recovery_point == "allocated"


# --- a record past its retention window --------------------------------------------


def test_a_record_past_its_window_is_not_replaced_while_its_lease_is_live(record_table):
    """A long handler heartbeats past its key's retention window: a retry (same or
    another body) still gets 409, never a second owner beside the running one."""
    sc = scope()
    owner = claim(sc, retention_s=60)
    with testing.travel(20):
        assert store.extend(owner, 600) is True
    with testing.travel(120):
        for fp in (FP, OTHER_FP):
            duplicate = claim(sc, fp, retention_s=60)
            assert isinstance(duplicate, store.Existing), duplicate
            assert not duplicate.completed and duplicate.lease_remaining > 0
            # The owner's record is what stands: another body is told 422, not 409.
            assert (duplicate.record_id, duplicate.fingerprint) == (owner.record_id, FP)
        done(owner)  # the record is still the owner's
    assert IdempotencyRecord.objects.filter(key=sc.key).count() == 1


def test_a_heartbeat_after_the_read_keeps_an_expired_record_from_being_forgotten(
    record_table, monkeypatch
):
    """Past its window and its lease, a record may be forgotten so the key runs anew;
    but the owner's heartbeat landed after the contender read it: the delete re-checks
    the lease and the running owner keeps its record."""
    sc = scope()
    owner = claim(sc, retention_s=60)

    def heartbeat() -> None:
        assert in_thread(lambda: store.extend(owner, 600)) is True

    before(monkeypatch, "forget", heartbeat)
    with testing.travel(120):
        result = claim(sc, retention_s=60)
        done(owner)
    assert isinstance(result, store.Existing), result
    assert result.lease_remaining > 0 and result.record_id == owner.record_id
    assert IdempotencyRecord.objects.filter(key=sc.key).count() == 1


def test_a_record_past_its_window_and_its_lease_makes_way_once(record_table):
    """The other side of the rule: past both, the key is new, for exactly one of many
    concurrent contenders."""
    for _ in range(3):
        sc = scope()
        claim(sc, retention_s=60)
        barrier = threading.Barrier(8)
        runner = Runner()

        def contender() -> Any:
            barrier.wait(10)
            return claim(sc, OTHER_FP, retention_s=60)

        with testing.travel(120):
            for _ in range(8):
                runner.start(contender)
            results = runner.join()
        winners = [r for r in results if isinstance(r, store.Claim)]
        assert len(winners) == 1, results
        assert owner_of(sc) == winners[0].owner_token


# --- execution: the view's transaction ---------------------------------------------


@pytest.fixture
def token() -> str:
    return TokenFactory(user__username="guard").key


def _post(token_key: str, url: str, body: Any, key: str, **extra: Any) -> Any:
    return token_client(token_key).post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


def test_a_fenced_completion_rolls_back_the_views_writes(record_table, token, gate):
    """The owner's lease ran out and a retry took over and completed. When the owner
    finishes, its completion is fenced off and its writes roll back with it: one
    effect, and the client sees the retry's response."""
    gate_name, held = gate
    key = str(uuid.uuid4())
    runner = Runner()
    runner.start(
        lambda: _post(token, "/gate-then-write", {"name": "w"}, key, HTTP_X_GATE=gate_name)
    )
    assert held.entered.wait(30)
    with testing.travel(10):  # the 5 s lease ran out
        second = _post(token, "/gate-then-write", {"name": "w"}, key)
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    held.opened.set()
    (first,) = runner.join(30)
    assert first.status_code == 409, first.content
    assert json.loads(first.content)["type"].endswith("lease-lost")
    assert Widget.objects.filter(name="w").count() == 1
    replay = _post(token, "/gate-then-write", {"name": "w"}, key)
    assert replay["Idempotent-Replayed"] == "true" and replay.content == second.content


def test_the_views_own_database_error_is_its_500_not_a_store_failure(token):
    """The view's own statement fails (here a duplicate primary key): the view's 500, as
    without the app, and the key released - not 503 store-unavailable."""
    key = str(uuid.uuid4())

    def duplicate_row(request: Any) -> None:
        Widget.objects.create(pk=Widget.objects.get(name="dup").pk, name="again")

    HOOKS["during_view"] = duplicate_row
    client = token_client(token)
    response = client.post("/slow", {"name": "dup"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    del HOOKS["during_view"]
    assert response.status_code == 500, response.content
    assert IdempotencyRecord.objects.filter(key=key).count() == 0  # released
    retry = client.post("/slow", {"name": "dup"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert Widget.objects.filter(name="dup").count() == 1


# --- the relay's fence ---------------------------------------------------------------


class _Relays:
    """Two relays delivering one message: ``A`` (whose lease runs out) and ``B`` (which
    takes the message over). Each handler waits for its go-ahead, then succeeds or
    raises as told."""

    def __init__(self, outcomes: dict[str, str]) -> None:
        self.outcomes = outcomes
        self.entered = {name: threading.Event() for name in outcomes}
        self.go = {name: threading.Event() for name in outcomes}
        self.threads: dict[str, threading.Thread] = {}

    def handler(self, message: Any, dedup_key: str) -> None:
        name = threading.current_thread().name
        self.entered[name].set()
        assert self.go[name].wait(30)
        if self.outcomes[name] == "fail":
            raise RuntimeError(f"delivery by relay {name} failed")

    def start(self, name: str, lease: float) -> None:
        def run() -> None:
            try:
                relay.deliver_batch(10, lease=lease)
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads[name] = thread
        thread.start()
        assert self.entered[name].wait(30), f"relay {name} never called the handler"

    def finish(self, name: str) -> None:
        self.go[name].set()
        self.threads[name].join(30)
        assert not self.threads[name].is_alive(), f"relay {name} did not finish"

    def release_all(self) -> None:
        for event in self.go.values():
            event.set()


@pytest.fixture
def relays() -> Any:
    made: list[_Relays] = []

    def make(outcomes: dict[str, str]) -> _Relays:
        made.append(_Relays(outcomes))
        outbox.register("tests.fence")(made[-1].handler)
        with transaction.atomic():
            outbox.enqueue("tests.fence", {"n": 1})
        return made[-1]

    yield make
    for pair in made:
        pair.release_all()
    outbox.unregister("tests.fence")


def test_a_relay_whose_lease_ran_out_cannot_mark_the_message_sent(relays):
    """Relay A's lease ran out; relay B took the message over. A's late success must not
    overwrite B's claim: B's verdict (a failure, so a retry) stands."""
    pair = relays({"A": "succeed", "B": "fail"})
    pair.start("A", lease=2.0)
    with testing.travel(3):
        pair.start("B", lease=30.0)
        pair.finish("A")
        pair.finish("B")
    message = OutboxMessage.objects.get(topic="tests.fence")
    assert message.state == OutboxState.PENDING, message.state
    assert message.attempts == 2 and "relay B failed" in message.last_error


def test_a_relay_whose_lease_ran_out_cannot_reschedule_the_message(relays):
    """Relay A's lease ran out; relay B took the message over. A's late failure must not
    move B's claim: B's success marks it sent, with no error from A recorded."""
    pair = relays({"A": "fail", "B": "succeed"})
    pair.start("A", lease=2.0)
    with testing.travel(3):
        pair.start("B", lease=30.0)
        pair.finish("A")
        pair.finish("B")
    message = OutboxMessage.objects.get(topic="tests.fence")
    assert message.state == OutboxState.SENT, (message.state, message.last_error)
    assert message.last_error == ""


def test_a_message_on_its_last_attempt_is_not_buried_while_it_is_delivered(relays, settings):
    """Another relay pass while the last allowed attempt is still being delivered: the
    message is not dead-lettered under the relay that holds it, whose success stands."""
    settings.IDEMPOTENCY = {"OUTBOX_MAX_ATTEMPTS": 1}
    pair = relays({"A": "succeed"})
    pair.start("A", lease=30.0)
    assert relay.deliver_batch(10) == 0  # nothing due: A holds the message
    pair.finish("A")
    message = OutboxMessage.objects.get(topic="tests.fence")
    assert message.state == OutboxState.SENT, (message.state, message.last_error)


def test_a_hand_back_after_the_lease_ran_out_leaves_the_next_relays_claim_alone(settings):
    """Relay A blocks in its first handler past its lease; relay B claims A's batch
    again. A, stopped, hands back the messages it did not start: B's claim of them
    stands, so a third relay finds nothing due and B alone delivers them."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    with transaction.atomic():
        ids = [outbox.enqueue("tests.handback", {"n": n}).pk for n in range(3)]
    seen: list[tuple[str, int]] = []
    entered = {"A": threading.Event(), "B": threading.Event()}
    go = {"A": threading.Event(), "B": threading.Event()}

    def handler(message: OutboxMessage, dedup_key: str) -> None:
        who = threading.current_thread().name
        seen.append((who, message.pk))
        if who in entered and not entered[who].is_set():
            entered[who].set()
            assert go[who].wait(30)

    first = relay.Relay(lease=30.0)
    done: dict[str, int] = {}

    def run(name: str, deliver: Any) -> threading.Thread:
        def body() -> None:
            try:
                done[name] = deliver()
            finally:
                connections.close_all()

        thread = threading.Thread(target=body, name=name)
        thread.start()
        return thread

    outbox.register("tests.handback")(handler)
    try:
        a = run("A", lambda: first.deliver_batch(10))
        assert entered["A"].wait(30)
        with testing.travel(31):  # A's lease is over: B claims the batch again
            b = run("B", lambda: relay.deliver_batch(10, lease=30.0))
            assert entered["B"].wait(30)
            first.stop()
            go["A"].set()
            a.join(30)
            first.close()
            assert done["A"] == 1
            assert relay.deliver_batch(10) == 0  # B holds the rest
            go["B"].set()
            b.join(30)
    finally:
        for event in go.values():
            event.set()
        outbox.unregister("tests.handback")
    assert done["B"] == 3
    assert seen == [("A", ids[0]), ("B", ids[0]), ("B", ids[1]), ("B", ids[2])]
    rows = OutboxMessage.objects.filter(pk__in=ids)
    assert set(rows.values_list("state", "attempts")) == {(OutboxState.SENT, 2)}


@pytest.mark.postgres
def test_the_sweeper_creates_the_partitions_of_today_and_the_days_ahead():
    """After a sweep, today and each of ``PARTITIONS_AHEAD`` days ahead have their
    partition, so no claim on those days waits for one to be created."""
    from django_idempotency import retention
    from django_idempotency.conf import conf
    from django_idempotency.retention import partitions

    try:
        with testing.travel(40 * DAY):  # days nobody created yet
            report = retention.sweep()
            today = report.now.date()
        expected = {today + dt.timedelta(days=n) for n in range(conf.partitions_ahead + 1)}
        attached = {p.day for p in partitions.list_partitions(connection) if p.attached}
        assert expected <= attached, sorted(expected - attached)
        assert expected <= set(report.created)
    finally:
        retention.sweep()  # today's partitions again, for the tests that follow
