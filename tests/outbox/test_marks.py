"""The relay's grouped marks (docs/outbox.md, "Marks"): one UPDATE per group, the
claim's fence, the writer between batches, and what a killed relay redelivers."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency import outbox, signals
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel
from tests.support.faults import admin_connection, terminate, wait_for
from tests.support.pgbouncer import NOT_POOLED

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.pooled]


def enqueue(n: int, topic: str) -> list[int]:
    with transaction.atomic():
        return [outbox.enqueue(topic, {"n": i}).pk for i in range(n)]


def mark_statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "SET state = 'sent'" in q["sql"]]


@pytest.fixture
def noop() -> object:
    seen: list[int] = []
    outbox.register("marks.noop")(lambda message, key: seen.append(message.pk))
    yield seen
    outbox.unregister("marks.noop")


@pytest.mark.postgres
def test_a_batch_is_marked_in_one_statement_per_group(noop, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MARK_DELAY": 3600.0}
    ids = enqueue(50, "marks.noop")
    with CaptureQueriesContext(connection) as queries:
        assert relay.deliver_batch(100) == 50
    assert len(mark_statements(queries)) == 1  # the whole batch is one group
    assert noop == ids
    rows = OutboxMessage.objects.filter(pk__in=ids)
    assert set(rows.values_list("state", "attempts")) == {(OutboxState.SENT, 1)}
    assert rows.filter(sent_at__isnull=True).count() == 0


@pytest.mark.postgres
def test_the_writer_marks_a_batch_while_the_next_one_is_claimed(noop, settings):
    """Between batches of one ``Relay`` the marks are written by the writer thread; all
    are written once the relay is closed, each message sent once."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(30, "marks.noop")
    sent_by: list[str] = []
    signals.outbox_delivered.connect(
        receiver := lambda sender, **kw: sent_by.append(threading.current_thread().name)
    )
    try:
        with relay.Relay() as one:
            assert [one.deliver_batch(10) for _ in range(4)] == [10, 10, 10, 0]
    finally:
        signals.outbox_delivered.disconnect(receiver)
    assert sorted(noop) == ids
    assert len(sent_by) == 30
    assert "outbox-marks-writer" in sent_by  # at least one group was written there
    rows = OutboxMessage.objects.filter(pk__in=ids)
    assert set(rows.values_list("state", "attempts")) == {(OutboxState.SENT, 1)}


@pytest.mark.postgres
def test_a_group_mark_is_fenced_by_lease_end_and_attempts(noop, settings):
    """A message claimed again by another relay is left alone: only the messages this
    claim still holds are marked."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MARK_DELAY": 3600.0}
    ids = enqueue(3, "marks.noop")
    taken: list[int] = []

    def take_over(message: OutboxMessage, key: str) -> None:
        if message.pk == ids[1] and not taken:
            taken.append(message.pk)
            # Another claim of the message: its attempt count moved on. The lease end
            # is kept, so only the attempts part of the fence tells the claims apart.
            OutboxMessage.objects.filter(pk=ids[1]).update(attempts=2)

    outbox.unregister("marks.noop")
    outbox.register("marks.noop")(take_over)
    assert relay.deliver_batch(10) == 3
    states = dict(OutboxMessage.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert states == {
        ids[0]: OutboxState.SENT,
        ids[1]: OutboxState.PENDING,  # attempts differ from the claim's: not this claim's
        ids[2]: OutboxState.SENT,
    }


CHILD = """
import os, sys
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
from django.conf import settings
from django.db import connections

connections["default"].settings_dict["NAME"] = sys.argv[1]
# Marks wait for the end of the batch: the delivered ones are pending when killed.
settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MARK_DELAY": 3600.0}
from django_idempotency import outbox
from django_idempotency.outbox import relay

block = int(sys.argv[2])


@outbox.handler("marks.kill")
def deliver(message, dedup_key):
    print("delivered", message.pk, flush=True)
    if message.pk == block:
        sys.stdin.readline()  # blocks until the parent kills this process


one = relay.Relay(lease=60)
one.deliver_batch(2)
one.close()  # the first batch's marks are written
print("closed", flush=True)
one.deliver_batch(10)
"""


@pytest.mark.postgres
def test_a_relay_killed_with_pending_marks_redelivers_only_those(settings):
    """Killed while the second batch's marks wait: the first batch stays sent; the
    second batch's delivered messages, the one whose handler ran and those not started
    are delivered again after the lease, nothing else."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(6, "marks.kill")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, connection.settings_dict["NAME"], str(ids[4])],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in child.stdout:  # handshake: the handler of ids[4] is running
            lines.append(line.split())
            if line.split() == ["delivered", str(ids[4])]:
                break
        assert lines[-1] == ["delivered", str(ids[4])], (lines, child.stderr.read())
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.stdin.close()
        child.stdout.close()
        child.stderr.close()
    assert lines[:3] == [["delivered", str(ids[0])], ["delivered", str(ids[1])], ["closed"]]

    rows = OutboxMessage.objects.filter(pk__in=ids).order_by("pk")
    assert (
        list(rows.values_list("state", flat=True))
        == [OutboxState.SENT] * 2 + [OutboxState.PENDING] * 4
    )
    seen: list[int] = []
    outbox.register("marks.kill")(lambda message, key: seen.append(message.pk))
    try:
        assert relay.deliver_batch(10) == 0  # held by the dead relay's lease
        with travel(61):
            assert relay.deliver_batch(10) == 4
    finally:
        outbox.unregister("marks.kill")
    assert seen == ids[2:]  # the pending marks, the running one, the one not started
    assert (
        list(rows.values_list("state", "attempts"))
        == [(OutboxState.SENT, 1)] * 2 + [(OutboxState.SENT, 2)] * 4
    )


class Batches(threading.Thread):
    """A relay on its own thread: ``Relay.deliver_batch`` with each size, then close."""

    def __init__(self, *sizes: int) -> None:
        super().__init__(name="relay-under-test")
        self.sizes = sizes
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with relay.Relay(lease=60) as one:
                for size in self.sizes:
                    one.deliver_batch(size)
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()


def sent(ids: list[int]) -> bool:
    rows = OutboxMessage.objects.filter(pk__in=ids, state=OutboxState.SENT)
    return rows.count() == len(ids)


@pytest.mark.postgres
@NOT_POOLED
def test_the_watchdog_reconnects_when_its_connection_dies(settings, caplog):
    """The marks' writer loses its connection (its backend terminated, as in a server
    restart) between two groups: it connects again and writes the next group at its
    deadline while a later handler still blocks, with one warning in the log."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MARK_DELAY": 0.05}
    caplog.set_level(logging.INFO, logger="django_idempotency.outbox")
    ids = enqueue(3, "marks.dies")
    writer: list[int] = []
    entered, proceed = threading.Event(), threading.Event()

    def on_delivered(sender: str, **kwargs: object) -> None:
        if threading.current_thread().name == "outbox-marks-writer":
            writer.append(connections["default"].connection.info.backend_pid)

    def handler(message: OutboxMessage, key: str) -> None:
        if message.pk == ids[1]:
            terminate(wait_for(lambda: writer)[-1])  # the writer wrote the first batch
        if message.pk == ids[2]:
            entered.set()
            proceed.wait(30)

    outbox.register("marks.dies")(handler)
    signals.outbox_delivered.connect(on_delivered)
    batches = Batches(1, 10)
    try:
        batches.start()
        assert entered.wait(30)
        wait_for(lambda: sent(ids[:2]), timeout=10)  # while handler 2 blocks
    finally:
        proceed.set()
        batches.join(30)
        signals.outbox_delivered.disconnect(on_delivered)
        outbox.unregister("marks.dies")
    assert batches.error is None
    assert sent(ids)
    warnings = [r for r in caplog.records if "marks not written yet" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "outbox marks written again after 1 failed tries" in caplog.text


@pytest.mark.postgres
def test_marks_retried_after_a_failed_write_keep_their_deadline(settings, caplog):
    """The writer's write of a group fails while the relay delivers the next message,
    whose mark joins a new group (due ``OUTBOX_MARK_DELAY``, an hour here, later). The
    failed group is retried at once, not at the newer group's deadline: both messages
    are sent while a later handler still blocks."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MARK_DELAY": 3600.0}
    ids = enqueue(3, "marks.retry")
    locker, observer = admin_connection(), admin_connection()
    entered, proceed = threading.Event(), threading.Event()

    def lock_waiter() -> int | None:
        row = observer.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            ["%SET state = 'sent'%"],
        ).fetchone()
        return row[0] if row else None

    def handler(message: OutboxMessage, key: str) -> None:
        if message.pk == ids[0]:  # its mark will wait for this row lock
            locker.execute("BEGIN")
            locker.execute(
                "SELECT 1 FROM django_idempotency_outbox WHERE id = %s FOR UPDATE", [ids[0]]
            )
        if message.pk == ids[1]:
            wait_for(lock_waiter)  # the writer took the first group and waits
        if message.pk == ids[2]:
            entered.set()
            proceed.wait(30)

    outbox.register("marks.retry")(handler)
    batches = Batches(1, 10)
    try:
        batches.start()
        assert entered.wait(30)
        observer.execute("SELECT pg_cancel_backend(%s)", [wait_for(lock_waiter)])
        wait_for(lambda: "marks not written yet" in caplog.text)
        locker.execute("ROLLBACK")  # the row lock is gone: the retry can write
        wait_for(lambda: sent(ids[:2]), timeout=10)  # while handler 2 blocks
    finally:
        proceed.set()
        batches.join(30)
        outbox.unregister("marks.retry")
        locker.close()
        observer.close()
    assert batches.error is None
    assert sent(ids)


@pytest.mark.postgres
def test_a_relay_used_again_after_close_marks_while_a_later_handler_blocks(settings):
    """The command closes its relay before it sleeps, then uses it again. After that,
    the first message of a batch is still marked sent while the batch's next handler
    blocks: closing stopped the watchdog, the next batch started it again."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    entered, proceed = threading.Event(), threading.Event()
    closed, enqueued = threading.Event(), threading.Event()
    blocking: list[int] = []
    errors: list[BaseException] = []

    def handler(message: OutboxMessage, key: str) -> None:
        if message.pk in blocking:
            entered.set()
            proceed.wait(30)

    def relay_thread() -> None:
        try:
            with relay.Relay() as each:
                each.deliver_batch(10)
                each.close()  # as the command does before it sleeps
                closed.set()
                assert enqueued.wait(30)
                each.deliver_batch(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    outbox.register("marks.again")(handler)
    try:
        enqueue(1, "marks.again")
        thread = threading.Thread(target=relay_thread)
        thread.start()
        assert closed.wait(30)
        ids = enqueue(2, "marks.again")
        blocking.append(ids[1])
        enqueued.set()
        assert entered.wait(30) or errors, "the relay never ran its second batch"
        wait_for(lambda: sent(ids[:1]), timeout=10)  # while handler 2 blocks
    finally:
        proceed.set()
        enqueued.set()
        thread.join(30)
        outbox.unregister("marks.again")
    assert not errors, errors
    assert sent(ids)
