"""Owner presence and the sessions that hold it, on PostgreSQL (real threads, separate
sessions): a phased owner between phases, an inbox block in the owner's session,
bounded waits, a request that fails between its claim and its view, a waiter that
times out, a takeover by lease, a claim in a caller's manual transaction.

One documented limit is a strict ``xfail`` test: it fails while the limit stands."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_idempotency import exceptions, signals, store
from django_idempotency.models import IdempotencyRecord
from django_idempotency.store import clock, presence
from tests.support.concurrency import Runner
from tests.support.faults import direct_presence  # noqa: F401  (the fixture)
from tests.support.testapp.models import Widget
from tests.support.two_database_app import (
    FP,
    HELD,
    OPEN,
    PRINCIPAL,
    advisory_locks_held,
    post,
)

pytestmark = [
    pytest.mark.usefixtures("direct_presence"),
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
    pytest.mark.urls("tests.support.two_database_app"),
]


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limit (docs/robustness.md, owner presence): "
        "a view that closes its database connection gives up its presence; later phases are fenced"
    ),
)
def test_a_live_phased_owner_that_closes_its_idle_connection_keeps_its_claim() -> None:
    """A phased owner alive between two phases (in a long downstream call) that closed its idle
    database connection, as Django's ``close_old_connections()`` does with the default
    ``CONN_MAX_AGE = 0``, keeps its claim: a duplicate gets 409 while the owner's lease
    is live, and phase two's downstream call is not made twice. The docs promise the
    owner keeps the lock "for its whole execution, across the phases of a phased view".
    A documented limit (strict xfail): the presence lock is tied to a Django connection
    the view is free to close, so the duplicate takes the claim over at once
    (``by_presence``)."""
    key = str(uuid.uuid4())
    HELD.clear()
    OPEN.clear()
    takeovers: list[bool] = []

    def on_claimed(sender: Any, taken_over: bool, presence: bool = False, **kw: Any) -> None:
        if taken_over:
            takeovers.append(presence)

    signals.claimed.connect(on_claimed)
    runner = Runner()
    runner.start(lambda: post("/phased-long-call", key, HTTP_X_HOLD="1"))
    try:
        assert HELD.wait(30)
        # A closed connection's server session ends a moment later: the duplicate is sent
        # once the owner's locks are gone (or after 10 s), so it meets one state only.
        deadline, pause = time.monotonic() + 10, threading.Event()
        while advisory_locks_held() and time.monotonic() < deadline:
            pause.wait(0.005)  # polls a database state; nothing to wake it otherwise
        duplicate = post("/phased-long-call", key)
    finally:
        OPEN.set()
        signals.claimed.disconnect(on_claimed)
    runner.join()
    assert takeovers in ([], [True])  # if taken over, then by presence, not by the lease
    assert duplicate.status_code == 409, (
        f"a live owner (lease 60 s, mid-view) was taken over: {duplicate.status_code}, "
        f"phase two ran {Widget.objects.filter(name='two').count()} times"
    )


def test_an_inner_once_block_in_the_owners_session_keeps_the_outer_lock() -> None:
    """Two claims share one database session: a phased view's code runs an inbox ``once()``
    block (its own claim, presence lock and completion). The inner completion releases
    only the inner key's lock (reentrant session locks are counted per key), so the
    outer owner stays present and a duplicate of the outer request gets 409, not a
    presence takeover."""
    key = str(uuid.uuid4())
    HELD.clear()
    OPEN.clear()
    runner = Runner()
    runner.start(lambda: post("/phased-inner-once", key, HTTP_X_HOLD="1"))
    try:
        assert HELD.wait(30)
        duplicate = post("/phased-inner-once", key)
    finally:
        OPEN.set()
    (first,) = runner.join()
    assert duplicate.status_code == 409
    assert first.status_code == 201
    assert Widget.objects.filter(name="one").count() == 1
    assert advisory_locks_held() == 0


def test_a_waiting_duplicate_never_waits_longer_than_its_wait() -> None:
    """``presence.wait_for_owner(using, scope, seconds)`` waits twice: for the presence lock,
    then for the row lock of the owner's completion; the second wait gets only what is
    left of ``seconds``, so a duplicate never waits longer than its ``wait=``. The owner
    completes while the duplicate queues on its presence lock and keeps its transaction
    open: the ``lock_timeout`` of the row wait is below that of the presence wait. No
    clock is asserted: the two timeouts the waiter set are read from its statements."""
    from django.test.utils import CaptureQueriesContext

    sc = store.Scope(PRINCIPAL, "POST /wait", str(uuid.uuid4()))
    claimed, completion_sent, finish = threading.Event(), threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def owner() -> None:
        try:
            won = store.claim(sc, FP, lease=30, retention=3600)
            assert isinstance(won, store.Claim) and won.present
            claimed.set()
            _wait_until_a_lock_is_awaited()
            with transaction.atomic():
                store.complete(won, store.StoredResponse(201, [], b"{}"))
                completion_sent.set()
                finish.wait(30)  # its transaction stays open past the duplicate's wait
        finally:
            connections.close_all()

    def waiter() -> None:
        try:
            with CaptureQueriesContext(connections["default"]) as queries:
                result["woken"] = presence.wait_for_owner("default", sc, 1.0)
            result["timeouts"] = [
                int(q["sql"].split("'")[-2].removesuffix("ms"))
                for q in queries.captured_queries
                if "lock_timeout" in q["sql"]
            ]
        finally:
            connections.close_all()

    owner_thread = threading.Thread(target=owner, daemon=True)
    owner_thread.start()
    assert claimed.wait(30)
    waiter_thread = threading.Thread(target=waiter, daemon=True)
    waiter_thread.start()
    waiter_thread.join(30)
    finish.set()
    owner_thread.join(30)
    assert completion_sent.is_set()
    assert result["woken"] is False  # the owner's transaction outlived the wait
    first, second = result["timeouts"]
    assert first <= 1000 and second < first, result["timeouts"]


def _wait_until_a_lock_is_awaited() -> None:
    """Block until some session waits for an advisory lock (a bounded poll of pg_locks)."""
    deadline = time.monotonic() + 30
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("no session ever waited for an advisory lock")


def test_a_failure_between_the_claim_and_the_view_releases_the_presence_lock() -> None:
    """A ``claimed`` signal receiver that raises (a metrics exporter whose backend is down, an
    audit hook) fails the request after ``store.claim`` took the session-level presence
    lock, before the view runs: the lock is released all the same ("No lock leaks ...
    every other way out of a request ... releases it"). The session keeps no advisory
    lock, and a retry from another session takes the dead request over instead of
    getting 409 for the whole lease."""
    key = str(uuid.uuid4())

    def broken_receiver(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("the metrics backend is down")

    signals.claimed.connect(broken_receiver)
    try:
        response = post("/plain", key)
    finally:
        signals.claimed.disconnect(broken_receiver)
    assert response.status_code == 500
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    leaked = advisory_locks_held(pid)

    def retry() -> int:
        try:
            return int(post("/plain", key).status_code)
        finally:
            connections.close_all()

    runner = Runner()
    runner.start(retry)
    (status,) = runner.join()
    assert leaked == 0, "the failed request's session still holds the presence lock"
    assert status != 409, "a retry of a dead request waits for the lease"


def test_a_waiter_that_times_out_leaves_no_lock_and_frees_its_place() -> None:
    """A duplicate waiting on a live owner's presence lock gives up after its ``seconds``
    (``lock_timeout``), returns ``False``, holds no advisory lock afterwards (its shared
    lock is transaction-scoped) and leaves the ``MAX_WAITERS`` count as it found it; the
    owner, still running, is not taken over."""
    sc = store.Scope(PRINCIPAL, "POST /waiter-timeout", str(uuid.uuid4()))
    claimed = threading.Event()
    done = threading.Event()

    def owner() -> None:
        try:
            won = store.claim(sc, FP, lease=30, retention=3600)
            assert isinstance(won, store.Claim) and won.present
            claimed.set()
            assert done.wait(30)
            with transaction.atomic():
                store.complete(won, store.StoredResponse(201, [], b"{}"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=owner, daemon=True)
    thread.start()
    try:
        assert claimed.wait(30)
        before = presence.waiters.count
        assert presence.wait_for_owner("default", sc, 0.3) is False
        assert presence.waiters.count == before
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        assert advisory_locks_held(pid) == 0
        found = store.claim(sc, FP, lease=30, retention=3600)
        assert isinstance(found, store.Existing) and found.response is None  # not taken
    finally:
        done.set()
        thread.join(30)
    assert advisory_locks_held() == 0


def test_after_a_takeover_by_lease_the_new_owner_is_never_taken_over_by_presence() -> None:
    """Owner O (its own session, holding the presence lock) outlives its lease; D takes the
    claim over by lease while O still holds the lock, so D's claim has no presence
    (``owner_pid`` NULL). O then completes: fenced off (``LeaseLost``), its statement
    releases O's lock. A third contender E, from a third session, finds the lock free,
    but the record names no present owner: it gets the in-flight record (the lease
    decides for D), never a presence takeover of the live D."""
    sc = store.Scope(PRINCIPAL, "POST /lease-takeover", str(uuid.uuid4()))
    claimed, go, finished = threading.Event(), threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def in_thread(func: Any) -> Any:
        def run() -> None:
            try:
                func()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def owner() -> None:
        won = store.claim(sc, FP, lease=5, retention=3600)
        assert isinstance(won, store.Claim) and won.present
        claimed.set()
        assert go.wait(30)
        try:
            with transaction.atomic():
                store.complete(won, store.StoredResponse(201, [], b"{}"))
        except exceptions.LeaseLost:
            outcome["owner"] = "fenced"
        finished.set()

    def third() -> None:
        outcome["third"] = store.claim(sc, FP, lease=30, retention=3600)

    o = in_thread(owner)
    try:
        assert claimed.wait(30)
        clock.set_offset(10)  # O's lease has run out; O is still alive and present
        taken = store.claim(sc, FP, lease=30, retention=3600)
        assert isinstance(taken, store.Claim) and taken.taken_over
        assert not taken.by_presence and not taken.present
        go.set()
        assert finished.wait(30)
        in_thread(third).join(30)
    finally:
        go.set()
        o.join(30)
        clock.set_offset(0)
    assert outcome["owner"] == "fenced"
    assert isinstance(outcome["third"], store.Existing)
    assert outcome["third"].response is None and outcome["third"].lease_remaining > 0


def test_a_claim_rolled_back_with_a_callers_manual_transaction_leaves_no_presence_lock(
    record_table: str,
) -> None:
    """With Django's manual transaction management (``set_autocommit(False)``) a claim is
    inside the caller's transaction though not in an atomic block: it takes no
    session-level presence lock there, so when the caller rolls back, the claim is gone
    and the session holds no advisory lock (session advisory locks ignore ROLLBACK).
    Later claims of that scope from other sessions keep their presence, and no waiter
    queues on a lock nobody would release."""
    sc = store.Scope(PRINCIPAL, "POST /manual-leak", str(uuid.uuid4()))
    transaction.set_autocommit(False)
    try:
        won = store.claim(sc, FP, lease=30, retention=3600)
        assert isinstance(won, store.Claim)
        transaction.rollback()  # the caller's transaction fails: the claim goes with it
    finally:
        transaction.set_autocommit(True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    assert not IdempotencyRecord.objects.filter(key=sc.key).exists()
    assert advisory_locks_held(pid) == 0, "the rolled-back claim's presence lock stayed"
