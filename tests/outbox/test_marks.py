"""The relay's grouped marks (docs/outbox.md, "Marks"): one UPDATE per group, the
claim's fence, every batch marked when it returns, and what a killed relay redelivers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_idempotency import outbox, signals
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel

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
def test_each_batch_of_a_relay_is_marked_when_it_returns(noop, settings):
    """Batch after batch of one ``Relay``: each batch's messages are sent when its
    ``deliver_batch`` returns, each once, with one ``delivered`` signal each."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(30, "marks.noop")
    delivered: list[int] = []
    signals.outbox_delivered.connect(
        receiver := lambda sender, **kw: delivered.append(kw["message_id"])
    )
    try:
        with relay.Relay() as one:
            for batch in range(3):
                assert one.deliver_batch(10) == 10
                assert sent(ids[: 10 * (batch + 1)])
            assert one.deliver_batch(10) == 0
    finally:
        signals.outbox_delivered.disconnect(receiver)
    assert sorted(noop) == ids
    assert sorted(delivered) == ids
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


def sent(ids: list[int]) -> bool:
    rows = OutboxMessage.objects.filter(pk__in=ids, state=OutboxState.SENT)
    return rows.count() == len(ids)
