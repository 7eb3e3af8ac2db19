"""SQLite, one process, many threads: the same once-only guarantee (docs/storage.md).

SQLite has one writer at a time, so duplicates queue on its lock instead of racing;
the outcome must still be one execution, every other answer a 409 or a replay.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections

from django_idempotency import inbox, testing
from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.concurrency import Runner, token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.gates import HOOKS
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


# A transaction that reads before it writes cannot wait for SQLite's write lock: if
# another connection holds it at the write, the write fails at once, whatever the busy
# timeout (https://www.sqlite.org/lang_transaction.html). The app's own transactions
# around a view, a phase or an inbox body take the lock first, so that other writer
# waits instead (or, as here with no busy timeout, is refused) and the view's write
# goes through.


@contextmanager
def another_writer(outcome: list[str]):
    """A second connection that tries to become the writer just before the view writes."""
    connection = connections["default"]
    other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None)
    try:
        try:
            other.execute("BEGIN IMMEDIATE")
            outcome.append("took the write lock")
        except sqlite3.OperationalError as exc:
            outcome.append(str(exc))
        yield
    finally:
        other.close()  # rolls its transaction back, if it opened one


def _with_another_writer(outcome: list[str]):
    HOOKS["another_writer"] = lambda request: another_writer(outcome)


@pytest.fixture
def sqlite_file() -> Iterator[None]:
    if connections["default"].vendor != "sqlite":
        pytest.skip("SQLite's single writer")
    yield


@pytest.mark.parametrize("path", ["/count-then-create", "/phased-count-then-create"])
def test_a_view_that_reads_before_it_writes_keeps_the_write_lock_from_its_start(sqlite_file, path):
    token = TokenFactory(user__username="sqlite-reader").key
    outcome: list[str] = []
    _with_another_writer(outcome)

    response = token_client(token).post(
        path, {"name": "counted"}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4())
    )

    assert response.status_code == 201, response.content
    assert outcome == ["database is locked"]  # the view was the writer already
    assert Widget.objects.filter(name="counted").count() == 1


def test_an_inbox_body_that_reads_before_it_writes_keeps_the_write_lock_from_its_start(
    sqlite_file,
):
    outcome: list[str] = []
    with inbox.once("evt-reads-first", principal="consumer", endpoint="count") as attempt:
        if not attempt.done:
            seen = Widget.objects.filter(name="counted").count()
            with another_writer(outcome):
                Widget.objects.create(name="counted", size=seen)
            attempt.result = {"seen": seen}

    assert outcome == ["database is locked"]
    assert Widget.objects.filter(name="counted").count() == 1


def test_a_retry_after_the_lease_ran_out_waits_for_the_running_view_and_replays_it(
    sqlite_file, gate
):
    """The view's lease runs out while it runs. A retry cannot take it over: the view
    holds the write lock, so the retry's claim waits for the view's commit and then
    finds the completed record. One execution; both answers are the view's."""
    token = TokenFactory(user__username="sqlite-slow").key
    gate_name, held = gate
    key = str(uuid.uuid4())
    runner = Runner()
    runner.start(
        lambda: token_client(token).post(
            "/gate-then-write",
            {"name": "w"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=key,
            HTTP_X_GATE=gate_name,
        )
    )
    assert held.entered.wait(30)
    retries = Runner()
    with testing.travel(10):  # the 5 s lease ran out
        retries.start(
            lambda: token_client(token).post(
                "/gate-then-write", {"name": "w"}, format="json", HTTP_IDEMPOTENCY_KEY=key
            )
        )
        held.opened.set()
        (first,) = runner.join(30)
        (retry,) = retries.join(30)

    assert first.status_code == 201 and "Idempotent-Replayed" not in first, first.content
    assert retry.status_code == 201 and retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Widget.objects.filter(name="w").count() == 1
