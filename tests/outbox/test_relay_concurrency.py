"""Relays under concurrency: real threads and a real killed process, separate connections."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction

from django_idempotency import outbox
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel
from tests.support.concurrency import Runner

pytestmark = pytest.mark.pooled

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def deliveries():
    """A handler for "conc.topic" recording (thread, message id) under a lock."""
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()
    state = {"barrier": None, "local": threading.local()}

    @outbox.handler("conc.topic")
    def record(message: OutboxMessage, dedup_key: str) -> None:
        assert dedup_key == message.dedup_key
        with lock:
            seen.append((threading.current_thread().name, message.pk))
        barrier = state["barrier"]
        if barrier is not None and not getattr(state["local"], "waited", False):
            state["local"].waited = True
            barrier.wait()  # every relay holds a claimed batch at the same time

    yield seen, state
    outbox.unregister("conc.topic")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_four_relays_deliver_500_messages_exactly_once(deliveries, settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    seen, state = deliveries
    with transaction.atomic():
        ids = [outbox.enqueue("conc.topic", {"n": n}).pk for n in range(500)]
    relays = 4
    state["barrier"] = threading.Barrier(relays, timeout=30)

    def run_relay() -> int:
        handled = 0
        while batch := relay.deliver_batch(10):
            handled += batch
        return handled

    runner = Runner()
    for _ in range(relays):
        runner.start(run_relay)
    handled = runner.join(timeout=120)

    assert sum(handled) == 500
    counts = Counter(pk for _thread, pk in seen)
    assert set(counts) == set(ids)  # none lost
    assert set(counts.values()) == {1}  # none delivered twice
    assert len({thread for thread, _pk in seen}) == relays  # they really ran together
    assert OutboxMessage.objects.filter(state=OutboxState.SENT, attempts=1).count() == 500


@pytest.mark.django_db(transaction=True)
def test_concurrent_relays_deliver_exactly_once_on_any_database(deliveries, settings):
    """On SQLite (no SKIP LOCKED) the per-message conditional claim keeps relays apart;
    they serialise on the single writer, but none delivers a message another did."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    seen, _state = deliveries
    with transaction.atomic():
        ids = [outbox.enqueue("conc.topic", {"n": n}).pk for n in range(200)]

    def run_relay() -> int:
        handled = 0
        while batch := relay.deliver_batch(7):
            handled += batch
        return handled

    runner = Runner()
    for _ in range(4):
        runner.start(run_relay)
    assert sum(runner.join(timeout=120)) == 200
    assert sorted(pk for _thread, pk in seen) == ids
    assert OutboxMessage.objects.filter(state=OutboxState.SENT, attempts=1).count() == 200


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claimed_batch_is_skipped_not_waited_for(deliveries, settings):
    """While one relay's claim transaction holds row locks, another claims other rows."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    seen, _state = deliveries
    with transaction.atomic():
        ids = [outbox.enqueue("conc.topic", {"n": n}).pk for n in range(6)]
    locked = threading.Event()
    release = threading.Event()

    def hold_locks() -> list[int]:
        with transaction.atomic():
            rows = list(
                OutboxMessage.objects.select_for_update()
                .filter(pk__in=ids[:3])
                .values_list("pk", flat=True)
            )
            locked.set()
            assert release.wait(30)
        return rows

    runner = Runner()
    runner.start(hold_locks)
    assert locked.wait(30)
    try:
        assert relay.deliver_batch(10) == 3  # not blocked by the locked rows
    finally:
        release.set()
        runner.join()
    assert sorted(pk for _t, pk in seen) == ids[3:]
    assert relay.deliver_batch(10) == 3
    assert sorted(pk for _t, pk in seen) == sorted(ids)


CHILD = """
import os, sys
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
from django.db import connections

connections["default"].settings_dict["NAME"] = sys.argv[1]
from django_idempotency import outbox
from django_idempotency.outbox import relay


@outbox.handler("kill.topic")
def block(message, dedup_key):
    print("entered", message.pk, flush=True)
    sys.stdin.readline()  # blocks until the parent kills this process


relay.deliver_batch(10, lease=60)
print("finished", flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_a_relay_killed_mid_batch_leaves_its_messages_deliverable(settings):
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    with transaction.atomic():
        ids = [outbox.enqueue("kill.topic", {"n": n}).pk for n in range(5)]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, connection.settings_dict["NAME"]],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()  # handshake: the handler is running
        assert line.split() == ["entered", str(ids[0])], child.stderr.read()
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.stdin.close()
        child.stdout.close()
        child.stderr.close()

    # Claimed by the dead relay: pending, one attempt, held until its lease ends.
    rows = OutboxMessage.objects.filter(pk__in=ids)
    assert set(rows.values_list("state", "attempts")) == {(OutboxState.PENDING, 1)}
    seen: list[int] = []
    outbox.register("kill.topic")(lambda message, key: seen.append(message.pk))
    try:
        assert relay.deliver_batch(10) == 0
        with travel(59):
            assert relay.deliver_batch(10) == 0
        with travel(61):
            assert relay.deliver_batch(10) == 5
    finally:
        outbox.unregister("kill.topic")
    assert seen == ids
    assert set(rows.values_list("state", "attempts")) == {(OutboxState.SENT, 2)}


RELAY_PROCESS = """
import os, sys
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
from django.conf import settings
from django.db import connections

connections["default"].settings_dict["NAME"] = sys.argv[1]
settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
from django_idempotency import outbox
from django_idempotency.outbox import relay

log, threads = sys.argv[2], int(sys.argv[3])


@outbox.handler("procs.topic")
def deliver(message, dedup_key):
    line = f"{message.pk} {dedup_key} {os.getpid()}\\n".encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)  # one short O_APPEND write: lines never interleave
    finally:
        os.close(fd)


print("ready", flush=True)
sys.stdin.readline()  # the start line: every relay starts at once
with relay.Relay(threads=threads) as one:
    while one.deliver_batch(20):
        pass
print("done", flush=True)
"""


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_relay_processes_deliver_each_message_once_while_leases_are_live(tmp_path, settings):
    """Four relay processes (one with a pool of 4 handler threads), each with its own
    connection, share one table: every message is delivered by exactly one of them,
    with its dedup key, within the lease (120 s), and marked sent at its first attempt."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    with transaction.atomic():
        messages = [outbox.enqueue("procs.topic", {"n": n}) for n in range(600)]
    log = tmp_path / "deliveries.log"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RELAY_PROCESS,
                connection.settings_dict["NAME"],
                str(log),
                str(threads),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for threads in (1, 1, 1, 4)
    ]
    try:
        for child in children:
            assert child.stdout.readline() == "ready\n", child.stderr.read()
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout.readline() == "done\n", child.stderr.read()
            assert child.wait(60) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            for stream in (child.stdin, child.stdout, child.stderr):
                stream.close()

    lines = [line.split() for line in log.read_text().splitlines()]
    delivered = sorted((int(pk), key) for pk, key, _pid in lines)
    assert delivered == sorted((m.pk, m.dedup_key) for m in messages)  # all, each once
    assert len({pid for _pk, _key, pid in lines}) >= 2  # they really shared the work
    states = OutboxMessage.objects.values_list("state", "attempts").distinct()
    assert list(states) == [(OutboxState.SENT, 1)]
