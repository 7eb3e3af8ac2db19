"""The inbox for plain callables and Celery task functions, in process (docs/inbox.md).

``once`` and ``idempotent_call`` reuse the store's claim, fenced completion and
release: the body's writes and its stored result commit together, a second call gets
the stored result, an exception releases the key, a crashed claim is taken over after
its lease, records are swept after their retention window. Real workers:
tests/integration/test_inbox_celery_workers.py.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction
from django.test import override_settings

from django_idempotency import exceptions, inbox, outbox, retention, signals, store, testing
from django_idempotency.exceptions import InvalidKey
from django_idempotency.models import IdempotencyRecord, OutboxMessage, RecordState
from django_idempotency.protocol import context
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]

SCOPE = {"principal": "consumer:invoices", "endpoint": "invoices.apply"}


def apply(key: str, amount: int = 5, *, fail: bool = False) -> Any:
    with inbox.once(key, payload={"amount": amount}, **SCOPE) as attempt:
        if attempt.done:
            return attempt.result
        widget = Widget.objects.create(name=key, size=amount)
        if fail:
            raise RuntimeError("downstream refused")
        attempt.result = {"widget": widget.pk, "amount": amount}
    return attempt.result


def test_once_runs_the_block_once_and_returns_the_stored_result():
    first = apply("evt-1")
    second = apply("evt-1")
    assert first == second == {"widget": Widget.objects.get().pk, "amount": 5}
    record = IdempotencyRecord.objects.get()
    assert record.state == RecordState.COMPLETED
    assert (record.principal, record.endpoint, record.key) == (
        "consumer:invoices", "invoices.apply", "evt-1"
    )  # fmt: skip
    assert json.loads(bytes(record.response_body)) == first


def test_an_exception_rolls_back_and_releases_so_a_retry_runs_again():
    with pytest.raises(RuntimeError, match="downstream refused"):
        apply("evt-2", fail=True)
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    assert apply("evt-2")["amount"] == 5
    assert Widget.objects.count() == 1


@pytest.mark.parametrize("stop", [SystemExit, KeyboardInterrupt])
def test_a_block_stopped_by_systemexit_or_keyboardinterrupt_releases_its_key(stop):
    """A worker shut down mid-block (``SystemExit`` from a signal handler, Ctrl-C) rolls
    the block back and releases the key, as any exception does: the next call runs the
    block at once instead of waiting out the lease (``InFlight``)."""
    with pytest.raises(stop), inbox.once("evt-stop", payload={"amount": 5}, **SCOPE):
        Widget.objects.create(name="interrupted")
        raise stop()
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    assert apply("evt-stop") == {"widget": Widget.objects.get().pk, "amount": 5}


def test_a_release_the_store_fails_is_logged_and_the_blocks_error_raised(monkeypatch, caplog):
    """A block that raises while the store cannot release its claim raises its own
    error, logs the failed release at ERROR with the scope's principal and endpoint (as
    a view's release does), and sends no ``released`` signal: the key stays claimed
    (``InFlight``) until its lease runs out."""

    def store_down(claim: store.Claim) -> bool:
        raise DatabaseError("the database went away")

    released: list[dict[str, Any]] = []

    def on_released(sender: Any, **kwargs: Any) -> None:
        released.append(kwargs)

    signals.released.connect(on_released, dispatch_uid="test-release-fails")
    monkeypatch.setattr(store, "release", store_down)
    caplog.set_level("ERROR", logger="django_idempotency")
    try:
        with pytest.raises(RuntimeError, match="downstream refused"):
            apply("evt-release", fail=True)
    finally:
        signals.released.disconnect(dispatch_uid="test-release-fails")
    (line,) = [r for r in caplog.records if "could not release" in r.message]
    assert line.levelname == "ERROR" and "the database went away" in line.getMessage()
    assert (line.principal, line.endpoint) == (SCOPE["principal"], SCOPE["endpoint"])
    assert released == []
    assert IdempotencyRecord.objects.get().state == RecordState.CLAIMED
    with pytest.raises(exceptions.InFlight):
        apply("evt-release")


def test_the_same_key_with_another_payload_is_key_reused():
    apply("evt-3", amount=5)
    with pytest.raises(exceptions.KeyReused):
        apply("evt-3", amount=6)
    assert Widget.objects.get().size == 5


def test_a_result_that_is_not_json_rolls_back_with_a_clear_error():
    unstorable = pytest.raises(exceptions.UnstorableResult, match="cannot be stored as JSON")
    with unstorable, inbox.once("evt-4", **SCOPE) as attempt:
        Widget.objects.create(name="x")
        attempt.result = {"when": object()}
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


@override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": 64})
def test_a_result_over_max_response_bytes_rolls_back_with_a_clear_error():
    too_large = pytest.raises(exceptions.UnstorableResult, match="MAX_RESPONSE_BYTES allows 64")
    with too_large, inbox.once("evt-5", **SCOPE) as attempt:
        Widget.objects.create(name="x")
        attempt.result = "y" * 100
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize("bad", ["", "caf\u00e9", "x" * 256])
def test_an_unusable_key_is_refused_before_anything_is_claimed(bad):
    with pytest.raises(InvalidKey):
        apply(bad)
    assert IdempotencyRecord.objects.count() == 0


def test_a_principal_and_an_endpoint_are_required():
    no_principal = pytest.raises(InvalidKey, match="principal")
    with no_principal, inbox.once("k", principal="", endpoint="e"):
        pass
    not_json = pytest.raises(TypeError, match="not JSON")
    with not_json, inbox.once("k", principal="p", endpoint="e", payload={1, 2}):
        pass


def test_the_body_sees_its_context_and_its_outbox_messages_link_to_the_record():
    with inbox.once("evt-6", **SCOPE) as attempt:
        current = context.current()
        assert current is attempt.context and current is not None
        assert current.key == "evt-6" and current.endpoint == "invoices.apply"
        message = outbox.enqueue("invoice.mail", {"n": 1})
        attempt.result = message.pk
    assert context.current() is None
    message = OutboxMessage.objects.get()
    assert message.record_id == IdempotencyRecord.objects.get().pk
    assert message.dedup_key.startswith("idk_")


def test_a_crashed_claim_is_taken_over_after_its_lease():
    """A worker killed mid-body leaves a claim; after its lease the next call runs."""
    fp = inbox.payload_fingerprint({"amount": 5})
    scope = store.Scope(SCOPE["principal"], SCOPE["endpoint"], "evt-7")
    crashed = store.claim(scope, fp, lease=30, retention=3600)
    assert isinstance(crashed, store.Claim)  # its body "died": never completed
    with pytest.raises(exceptions.InFlight) as in_flight:
        apply("evt-7")
    assert 0 < in_flight.value.retry_after <= 30
    with testing.travel(31), inbox.once("evt-7", payload={"amount": 5}, **SCOPE) as attempt:
        assert attempt.taken_over and not attempt.done
        attempt.result = "second"
    assert apply("evt-7") == "second"
    with pytest.raises(exceptions.LeaseLost), transaction.atomic():  # the crashed owner: fenced
        store.complete(crashed, store.StoredResponse(200, [], b"1"))


def test_records_are_swept_after_their_retention_window():
    three_days_ago = testing.travel(-3 * 86400)  # and kept for a minute
    with three_days_ago, inbox.once("evt-8", retention=60, payload={"amount": 5}, **SCOPE) as a:
        a.result = "three days ago"
    with inbox.once("evt-8b", **SCOPE) as attempt:  # today, kept for RETENTION
        attempt.result = "today"
    report = retention.sweep()
    assert not report.errors
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["evt-8b"]
    assert apply("evt-8") == {"widget": Widget.objects.get().pk, "amount": 5}  # new again


@pytest.mark.postgres
def test_a_duplicate_while_the_first_runs_is_in_flight_and_runs_nothing():
    entered, release = threading.Event(), threading.Event()
    results: list[Any] = []

    def first() -> None:
        try:
            with inbox.once("evt-9", **SCOPE) as attempt:
                Widget.objects.create(name="first")
                entered.set()
                assert release.wait(30)
                attempt.result = "first"
            results.append(attempt.result)
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert entered.wait(30)
        with pytest.raises(exceptions.InFlight), inbox.once("evt-9", **SCOPE) as attempt:
            Widget.objects.create(name="duplicate")
    finally:
        release.set()
        thread.join(30)
    assert results == ["first"] and list(Widget.objects.values_list("name", flat=True)) == ["first"]
    with inbox.once("evt-9", **SCOPE) as attempt:
        assert attempt.done and attempt.result == "first"


# The decorator for plain callables.

calls: list[str] = []


@inbox.idempotent_call(key="event_id", principal="consumer:ledger")
def book(event_id: str, amount: int, memo: str = "") -> tuple[int, str]:
    calls.append(event_id)
    Widget.objects.create(name=event_id, size=amount)
    return amount, memo


def test_idempotent_call_takes_the_key_from_an_argument():
    calls.clear()
    assert book("e-1", 3) == [3, ""]  # the stored JSON form, on the first call too
    assert book("e-1", amount=3) == [3, ""]
    assert calls == ["e-1"] and Widget.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.endpoint == "call:tests.inbox.test_calls.book"
    assert record.principal == "consumer:ledger"
    with pytest.raises(exceptions.KeyReused):
        book("e-1", 4)


def test_idempotent_call_with_callables_for_key_principal_and_payload():
    @inbox.idempotent_call(
        key=lambda order, **_: order["number"],
        principal=lambda order, **_: f"tenant:{order['tenant']}",
        payload=lambda order, **_: {"number": order["number"]},
        endpoint="orders.import",
    )
    def import_order(order: dict[str, Any], *, seen_at: object = None) -> int:
        return Widget.objects.create(name=str(order["number"])).pk

    first = import_order({"number": 42, "tenant": "a"}, seen_at=object())
    assert import_order({"number": 42, "tenant": "a"}, seen_at=object()) == first
    other_tenant = import_order({"number": 42, "tenant": "b"})
    assert other_tenant != first and Widget.objects.count() == 2
    assert sorted(IdempotencyRecord.objects.values_list("principal", "key")) == [
        ("tenant:a", "42"),
        ("tenant:b", "42"),
    ]


def test_idempotent_call_needs_json_arguments_or_a_payload():
    @inbox.idempotent_call(key="key", principal="p")
    def takes_an_object(key: str, thing: object) -> None:
        return None

    with pytest.raises(TypeError, match="pass payload="):
        takes_an_object("k", object())
    with pytest.raises(TypeError, match="no argument 'key'"):
        inbox.idempotent_call(key="key", principal="p")(lambda other: 1)(1)


# The Celery decorator, run in process (eager); real workers in
# tests/integration/test_inbox_celery_workers.py.


@pytest.fixture
def eager_app() -> Any:
    """A Celery app of its own, current while the test runs (other tests change it)."""
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    app = Celery("django-idempotency-inbox-eager", set_as_current=True)
    yield app
    previous.set_current()


def test_an_idempotent_shared_task_runs_its_body_once_per_key(eager_app):
    from django_idempotency.inbox.celery import idempotent_shared_task

    runs: list[str] = []

    @idempotent_shared_task(key="event_id", name="tests.inbox.charge", acks_late=True)
    def charge(event_id: str, cents: int) -> dict[str, int]:
        runs.append(event_id)
        return {"widget": Widget.objects.create(name=event_id, size=cents).pk}

    first = charge.apply(args=("ch-1", 100)).get()
    again = charge.apply(kwargs={"event_id": "ch-1", "cents": 100}).get()
    direct = charge("ch-1", 100)
    assert first == again == direct and runs == ["ch-1"]
    record = IdempotencyRecord.objects.get()
    assert (record.principal, record.endpoint) == ("celery", "task:tests.inbox.charge")


def test_a_bound_task_leaves_self_out_of_the_payload_and_retries_in_flight(eager_app):
    from celery import shared_task

    from django_idempotency.inbox.celery import idempotent_task

    @shared_task(bind=True, name="tests.inbox.bound")
    @idempotent_task(key="event_id", name="tests.inbox.bound")
    def bound(self: Any, event_id: str) -> str:
        return self.name

    assert bound.apply(args=("b-1",)).get() == "tests.inbox.bound"
    scope = store.Scope("celery", "task:tests.inbox.bound", "b-2")
    held = store.claim(scope, inbox.payload_fingerprint({"event_id": "b-2"}), lease=30,
                       retention=3600)  # fmt: skip
    assert isinstance(held, store.Claim)
    seen: list[str] = []

    def count(sender: str, **kwargs: Any) -> None:
        seen.append(sender)

    signals.in_flight.connect(count)
    try:
        # Eagerly, Celery runs each retry at once: the first try and max_retries (3)
        # retries find the key in flight, then the task fails with InFlight.
        result = bound.apply(args=("b-2",))
    finally:
        signals.in_flight.disconnect(count)
    assert result.state == "FAILURE" and isinstance(result.result, exceptions.InFlight)
    assert seen == ["task:tests.inbox.bound"] * 4
    with pytest.raises(exceptions.InFlight):  # called directly, outside a worker: raised
        bound("b-2")


# --- What the block does to its own transaction is its outcome -----------------------


def test_a_block_that_marks_its_transaction_for_rollback_stores_nothing_and_releases():
    """``transaction.set_rollback(True)`` in the block is its outcome, as in a view: the
    ``with`` statement ends normally, the block's writes roll back, its result is not
    stored and the key is released, so a retry runs the block again."""
    with inbox.once("evt-rb", **SCOPE) as attempt:
        Widget.objects.create(name="rolled back")
        attempt.result = {"declined": True}
        transaction.set_rollback(True)
    assert attempt.result == {"declined": True}  # as the block left it, not stored
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    assert apply("evt-rb") == {"widget": Widget.objects.get().pk, "amount": 5}


def test_a_function_that_marks_its_transaction_for_rollback_returns_its_result_unstored():
    """The same through ``idempotent_call``: the function's result is returned, nothing
    is kept, and the next call runs the function again."""
    runs: list[int] = []

    @inbox.idempotent_call(key="event_id", principal="consumer", endpoint="call:declines")
    def decline(event_id: str) -> dict[str, bool]:
        runs.append(1)
        Widget.objects.create(name=event_id)
        transaction.set_rollback(True)
        return {"declined": True}

    assert decline("evt-1") == decline("evt-1") == {"declined": True}
    assert len(runs) == 2 and IdempotencyRecord.objects.count() == Widget.objects.count() == 0


@pytest.mark.postgres
def test_a_block_that_catches_an_error_without_a_savepoint_stores_nothing(caplog):
    """On PostgreSQL a statement that fails inside the block's transaction, caught without
    a savepoint, aborts the transaction: the block's result is not stored, the key is
    released and a WARNING says why, instead of the store's statement failing."""
    from django.db import DatabaseError
    from django.db import connection as db

    caplog.set_level("WARNING", logger="django_idempotency")
    with inbox.once("evt-ab", **SCOPE) as attempt:
        Widget.objects.create(name="lost")
        try:
            with db.cursor() as cursor:
                cursor.execute("SELECT no_such_column FROM testapp_widget")
        except DatabaseError:
            attempt.result = "caught"
    assert IdempotencyRecord.objects.count() == Widget.objects.count() == 0
    assert any("without a savepoint" in r.message for r in caplog.records)


# --- Blocks that call blocks -----------------------------------------------------------


def test_a_block_with_the_scope_of_the_running_block_runs_as_part_of_it():
    """A ``once()`` block opened inside a running one with the same principal, endpoint
    and key is part of it (its payload is not compared): it runs, in the outer block's
    transaction, and the outer block's result is what is stored and returned later."""
    with inbox.once("evt-n", payload={"outer": 1}, **SCOPE) as outer:
        with inbox.once("evt-n", payload={"inner": 2}, **SCOPE) as inner:
            assert not inner.done and inner.context is outer.context
            inner.result = Widget.objects.create(name="inner").pk
        outer.result = {"inner": inner.result}
    assert outer.result == {"inner": Widget.objects.get().pk}
    record = IdempotencyRecord.objects.get()
    assert json.loads(bytes(record.response_body)) == outer.result
    with inbox.once("evt-n", payload={"outer": 1}, **SCOPE) as again:
        assert again.done and again.result == outer.result


def test_a_function_delegating_to_one_of_its_endpoint_runs_it_once():
    """An ``idempotent_call`` function that calls another one with the same endpoint
    and key (a task body delegating to the function it wraps) runs it as part of its
    own call: no ``InFlight`` against itself; a second call returns the stored result."""
    runs: list[str] = []

    @inbox.idempotent_call(key="event_id", principal="consumer", endpoint="call:apply")
    def apply_event(event_id: str) -> int:
        runs.append(event_id)
        return int(Widget.objects.create(name=event_id).pk)

    @inbox.idempotent_call(key="event_id", principal="consumer", endpoint="call:apply")
    def handle(event_id: str) -> dict[str, int]:
        return {"widget": apply_event(event_id)}

    first = handle("evt-d")
    assert first == {"widget": Widget.objects.get().pk} and runs == ["evt-d"]
    assert handle("evt-d") == first and runs == ["evt-d"]
