"""The relay's lease on the messages it claimed: a handler slower than the lease keeps
its message (the relay renews the lease) while the rest of its batch is handed back
and delivered by other relays, attempts count handler runs, and a message whose
handler kills the relay is dead-lettered after ``OUTBOX_MAX_ATTEMPTS`` runs."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.backends.signals import connection_created

from django_idempotency import outbox
from django_idempotency.conf import conf
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel
from tests.support.faults import terminate, wait_for
from tests.support.pgbouncer import NOT_POOLED
from tests.support.relay_process import SENT, child, states
from tests.support.relay_process import enqueue as enqueue_for_children

__all__ = ["child"]  # the fixture, used here

pytestmark = pytest.mark.django_db(transaction=True)


LEASE = 0.6  # seconds: short, so that a handler of three leases takes two seconds


def run_relays(count: int, handler: Any, messages: int) -> tuple[list[int], Counter[int]]:
    """``count`` relay threads, each a ``Relay`` with the short lease polling for
    batches, deliver ``messages`` messages of topic ``tests.lease``; returns their
    ids and how many times each one's handler ran once every message is sent."""
    runs: Counter[int] = Counter()
    lock = threading.Lock()
    finished = threading.Event()
    errors: list[BaseException] = []

    def counted(message: OutboxMessage, key: str) -> None:
        with lock:
            runs[message.pk] += 1
        handler(message)

    def relay_thread() -> None:
        try:
            with relay.Relay(lease=LEASE) as each:
                while not finished.is_set():
                    if each.deliver_batch(messages) == 0:
                        finished.wait(0.02)  # the poll interval, as the command's
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    outbox.register("tests.lease")(counted)
    try:
        with transaction.atomic():
            ids = [outbox.enqueue("tests.lease", {"n": n}).pk for n in range(messages)]
        threads = [threading.Thread(target=relay_thread) for _ in range(count)]
        for thread in threads:
            thread.start()
        try:
            wait_for(
                lambda: not OutboxMessage.objects.exclude(state=OutboxState.SENT).exists() or errors
            )
        finally:
            finished.set()
            for thread in threads:
                thread.join(30)
    finally:
        outbox.unregister("tests.lease")
    assert not errors, errors
    return ids, runs


@pytest.mark.postgres
@pytest.mark.parametrize("relays", [2, 4])
@pytest.mark.parametrize("leases", [0, 1, 3])
def test_a_handler_slower_than_the_lease_runs_once_and_its_batch_is_delivered_meanwhile(
    relays, leases, settings
):
    """Several relays; the first message's handler runs 0, 1 or 3 relay leases. Its
    relay renews its lease, so no other relay runs it again; half a lease after the
    claim the rest of its batch is handed back while the handler still runs, and the
    other relays deliver it meanwhile. Each handler runs once, each attempt counted is
    a run (1 each), and nothing is dead-lettered, even with 2 attempts allowed."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MAX_ATTEMPTS": 2}
    slow_ran: list[bool] = []

    def handler(message: OutboxMessage) -> None:
        if message.payload["n"] != 0 or not leases:
            return
        began = time.monotonic()
        # The others are delivered by the other relays while this handler runs.
        slow_ran.append(wait_others())
        left = leases * LEASE - (time.monotonic() - began)
        if left > 0:
            threading.Event().wait(left)  # the handler's own work: `leases` leases long

    def wait_others() -> bool:
        try:
            wait_for(
                lambda: OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 7,
                timeout=10,
            )
        except AssertionError:
            return False
        return True

    ids, runs = run_relays(relays, handler, messages=8)
    assert runs == Counter(dict.fromkeys(ids, 1)), "a handler ran twice, or never"
    rows = OutboxMessage.objects.values_list("state", "attempts")
    assert set(rows) == {(OutboxState.SENT, 1)}
    if leases:
        assert slow_ran == [True], "the batch waited for its slow handler"


@pytest.mark.postgres
@pytest.mark.parametrize("processes", [2, 4])
def test_relay_processes_run_a_handler_slower_than_the_lease_once(child, processes, settings):
    """Relay commands in processes of their own, with a lease of 0.6 s; the first
    message's handler blocks until its relay has renewed its lease past three leases.
    The rest of its batch is delivered meanwhile, and no other process runs it."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue_for_children(8)
    env = {"RELAY_LEASE": str(LEASE)}
    relays = [
        child([ids[0]], "--interval", "0.05", mark_delay=0.005, env=env) for _ in range(processes)
    ]
    wait_for(lambda: states(ids[1:]) == [(SENT, 1)] * 7, timeout=60)  # while handler 0 blocks
    claimed = OutboxMessage.objects.get(pk=ids[0]).available_at
    three_leases = claimed + dt.timedelta(seconds=3 * LEASE)
    wait_for(lambda: OutboxMessage.objects.get(pk=ids[0]).available_at >= three_leases, 60)
    for each in relays:
        each.release(ids[0])
    wait_for(lambda: states(ids) == [(SENT, 1)] * 8, timeout=60)
    for each in relays:
        each.signal(signal.SIGTERM)
    for each in relays:
        assert each.finish() == 0, each.stderr()
    runs = [line for each in relays for line in each.lines if line == f"delivered {ids[0]}"]
    assert len(runs) == 1, "another relay ran the slow handler again"


def test_a_message_that_kills_its_relay_is_dead_lettered_after_max_attempts():
    """A handler that kills its relay (``SystemExit``: a hard time limit, OOM) never reports
    back; each run after the lease counts an attempt, and after ``OUTBOX_MAX_ATTEMPTS``
    the message is dead-lettered, not retried for ever."""

    def poison(message, dedup_key):
        raise SystemExit("the worker is killed (a hard time limit, OOM)")

    outbox.register("tests.poison")(poison)
    try:
        with transaction.atomic():
            outbox.enqueue("tests.poison", {})
        kills = 0
        for i in range(conf.outbox_max_attempts + 3):  # each run starts after the lease
            with travel((i + 1) * (conf.outbox_relay_lease + 1)):
                try:
                    relay.deliver_batch(10)
                except SystemExit:
                    kills += 1
        assert kills == conf.outbox_max_attempts  # then it was buried, not retried
        message = OutboxMessage.objects.get(topic="tests.poison")
        assert message.state == OutboxState.DEAD
        assert message.attempts == conf.outbox_max_attempts
        assert "never reported back" in message.last_error
    finally:
        outbox.unregister("tests.poison")


KEEPER = "outbox-lease-keeper"


def renewed_past(pk: int, until: dt.datetime) -> bool:
    return OutboxMessage.objects.get(pk=pk).available_at > until


def blocking_relay(
    handler: Any, *, first: int | None = None, go: threading.Event | None = None
) -> tuple[threading.Thread, list[BaseException], threading.Event]:
    """A ``Relay`` with the short lease on a thread of its own: a batch of ``first``
    messages (if given) and ``close()``, then, once ``go`` is set, a batch of 10, then
    ``close()``. Returns the thread (started), the errors it met and the event set once
    the first batch's relay was closed."""
    errors: list[BaseException] = []
    closed = threading.Event()

    def run() -> None:
        try:
            with relay.Relay(lease=LEASE) as one:
                if first is not None:
                    one.deliver_batch(first)
                    one.close()  # as the command does before it sleeps
                closed.set()
                assert go is None or go.wait(30)
                one.deliver_batch(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    outbox.register("tests.keeper")(handler)
    thread = threading.Thread(target=run, name="relay-under-test")
    thread.start()
    return thread, errors, closed


@pytest.mark.postgres
@NOT_POOLED
def test_the_lease_is_renewed_after_the_keepers_connection_dies(settings, caplog):
    """The lease keeper's session is terminated (as in a server restart) while a handler
    blocks: the keeper connects again and renews the lease past the claim's, with one
    warning in the log, and the message is delivered once."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    caplog.set_level(logging.INFO, logger="django_idempotency.outbox")
    keepers: list[int] = []
    recorder = keeper_sessions(keepers)
    with transaction.atomic():
        pk = outbox.enqueue("tests.keeper", {}).pk
    proceed = threading.Event()

    def handler(message: OutboxMessage, key: str) -> None:
        claimed = OutboxMessage.objects.get(pk=message.pk).available_at
        terminate(wait_for(lambda: keepers)[-1])  # after its first renewal
        wait_for(lambda: len(keepers) > 1)  # it connected again
        wait_for(lambda: renewed_past(message.pk, claimed + dt.timedelta(seconds=LEASE)))
        proceed.set()

    thread, errors, _closed = blocking_relay(handler)
    try:
        assert proceed.wait(30)
    finally:
        thread.join(30)
        connection_created.disconnect(recorder)
        outbox.unregister("tests.keeper")
    assert not errors, errors
    assert OutboxMessage.objects.filter(pk=pk).values_list("state", "attempts").get() == (
        OutboxState.SENT,
        1,
    )
    warnings = [r for r in caplog.records if "lease not renewed yet" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "outbox relay lease renewed again after 1 failed tries" in caplog.text


@pytest.mark.postgres
def test_a_relay_used_again_after_close_renews_its_lease_while_a_handler_blocks(settings):
    """The command closes its relay before it sleeps, then uses it again: a handler of
    the later batch that blocks past the lease still has its lease renewed."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    with transaction.atomic():
        outbox.enqueue("tests.keeper", {"block": False})
    renewed = threading.Event()

    def handler(message: OutboxMessage, key: str) -> None:
        if message.payload["block"]:
            claimed = OutboxMessage.objects.get(pk=message.pk).available_at
            late = claimed + dt.timedelta(seconds=LEASE)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: renewed_past(message.pk, late), timeout=10)
                renewed.set()

    go = threading.Event()
    thread, errors, closed = blocking_relay(handler, first=10, go=go)
    try:
        assert closed.wait(30)
        with transaction.atomic():
            pk = outbox.enqueue("tests.keeper", {"block": True}).pk
    finally:
        go.set()
        thread.join(30)
        outbox.unregister("tests.keeper")
    assert not errors, errors
    assert renewed.is_set(), "the lease was not renewed while the handler blocked"
    assert OutboxMessage.objects.get(pk=pk).state == OutboxState.SENT


def keeper_sessions(pids: list[int]) -> Any:
    """Record the backend pid of each connection a lease keeper opens, in ``pids``."""

    def recorder(sender: object, connection: Any, **kwargs: object) -> None:
        if threading.current_thread().name == KEEPER:
            pids.append(connection.connection.info.backend_pid)

    connection_created.connect(recorder)
    return recorder
