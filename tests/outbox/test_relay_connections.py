"""The relay command closes the database connections it opened when it returns
(docs/outbox.md, "Management command"): its own on the calling thread, its lease
keeper's, its pool threads'. A process that runs it and lives on (a Celery worker, a
script or a test calling ``call_command``) keeps no server session of it, however the
command ends: drained (``--once``), ``--max-iterations``, ``SIGTERM`` or an exception.

The sessions are those of ``pg_stat_activity``, seen from a separate connection. The
test holds every connection the command opened (``connection_created``), so none is
closed by the garbage collector freeing a finished thread's storage: only the command
closing it ends its session.
"""

from __future__ import annotations

import io
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import ProgrammingError, connections, transaction
from django.db.backends.signals import connection_created

from django_idempotency import outbox, signals
from django_idempotency.models import OutboxMessage, OutboxState
from tests.support.faults import admin_connection, wait_for
from tests.support.pgbouncer import NOT_POOLED

pytestmark = [pytest.mark.postgres, NOT_POOLED, pytest.mark.django_db(transaction=True)]

TOPIC = "connections.topic"
REPLICA = "connections.replica"
KEEPER = "outbox-lease-keeper"


class Opened:
    """Every database connection opened while it listens: thread name, wrapper, pid.

    Holding the wrappers keeps their sessions alive unless something closes them.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, Any, int]] = []

    def __call__(self, sender: object, connection: Any, **kwargs: object) -> None:
        with self.lock:
            self.seen.append(
                (
                    threading.current_thread().name,
                    connection,
                    connection.connection.info.backend_pid,
                )
            )

    def threads(self) -> set[str]:
        return {thread for thread, _wrapper, _pid in self.seen}

    def pids(self) -> list[int]:
        return [pid for _thread, _wrapper, pid in self.seen]


@pytest.fixture
def opened() -> Iterator[Opened]:
    recorder = Opened()
    connection_created.connect(recorder)
    yield recorder
    connection_created.disconnect(recorder)


def live(pids: list[int]) -> list[int]:
    """The pids among ``pids`` whose session the server still has."""
    with admin_connection() as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
        ).fetchall()
    return sorted(row[0] for row in rows)


def enqueue(n: int) -> list[int]:
    with transaction.atomic():
        return [outbox.enqueue(TOPIC, {"n": i}).pk for i in range(n)]


class Handler:
    """Each call uses the ORM (a pool thread connects). Inline, the second waits until
    the lease keeper renewed the lease (its connection is open), and the last one ends
    the command as ``end`` says: ``"sigterm"`` or ``"error"`` (``SystemExit``). A
    ``delivered`` receiver opens a connection to another alias."""

    def __init__(self, ids: list[int], end: str, pooled: bool) -> None:
        self.ids, self.end, self.pooled = ids, end, pooled
        self.renewed = threading.Event()
        self.together = threading.Barrier(2, timeout=30)

    def on_connect(self, sender: object, connection: Any, **kwargs: object) -> None:
        if threading.current_thread().name == KEEPER:
            self.renewed.set()

    def on_delivered(self, sender: str, **kwargs: object) -> None:
        connections["replica"].ensure_connection()  # a receiver using another alias

    def __call__(self, message: OutboxMessage, dedup_key: str) -> None:
        assert OutboxMessage.objects.filter(pk=message.pk).exists()
        if self.pooled:
            if message.pk in self.ids[:2]:
                self.together.wait()  # both pool threads run a handler (and connect)
            return
        if message.pk == self.ids[1]:
            assert self.renewed.wait(30)  # the keeper renews the lease meanwhile
        if message.pk == self.ids[-1]:
            if self.end == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            elif self.end == "error":
                raise SystemExit(3)


@pytest.mark.django_db(transaction=True, databases=["default", "replica"])
@pytest.mark.parametrize(
    ("end", "arguments"),
    [
        pytest.param(end, arguments, id=end)
        for end, arguments in [
            ("once", ["--once"]),
            ("max-iterations", ["--max-iterations", "1"]),
            ("sigterm", ["--interval", "3600"]),
            ("error", ["--once"]),
            ("pool", ["--once", "--threads", "2"]),
        ]
    ],
)
def test_the_relay_command_closes_the_connections_it_opened_when_it_returns(
    opened, settings, end, arguments
):
    """However the command returns, no session it opened is left on the server: the
    calling thread's (a ``delivered`` receiver's to another alias included), the lease
    keeper's, the pool threads'."""
    if end == "sigterm" and threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGTERM is handled on the main thread only")
    # A lease short enough for the keeper to renew it (and connect) during the run.
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_RELAY_LEASE": 3.0}
    ids = enqueue(4)
    handler = Handler(ids, end, pooled=end == "pool")
    outbox.register(TOPIC)(handler)
    signals.outbox_delivered.connect(handler.on_delivered)
    connection_created.connect(handler.on_connect)
    connections["default"].close()  # the command opens the calling thread's own
    opened.seen.clear()
    try:
        if end == "error":
            with pytest.raises(SystemExit):
                call_command("idempotency_relay", *arguments, stdout=io.StringIO())
        else:
            call_command("idempotency_relay", *arguments, stdout=io.StringIO())
        pids = opened.pids()
        main = threading.current_thread().name  # the calling thread
        pool = {"outbox-relay-0", "outbox-relay-1"}
        assert opened.threads() >= ({main, *pool} if end == "pool" else {main, KEEPER})
        assert {w.alias for t, w, _pid in opened.seen if t == main} == {"default", "replica"}
        wait_for(lambda: not live(pids), timeout=10)  # the server ends each session
        assert all(wrapper.connection is None for _thread, wrapper, _pid in opened.seen)
    finally:
        connection_created.disconnect(handler.on_connect)
        signals.outbox_delivered.disconnect(handler.on_delivered)
        outbox.unregister(TOPIC)
    delivered = ids[:-1] if end == "error" else ids
    states = OutboxMessage.objects.filter(pk__in=delivered).values_list("state", flat=True)
    assert set(states) == {OutboxState.SENT}


def test_the_relay_command_leaves_the_callers_open_connection_open(opened, settings):
    """The calling thread's connection, open before the command, is the caller's: it
    stays open, in the same session (a worker's persistent connection is kept)."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(2)
    outbox.register(TOPIC)(lambda message, key: None)
    try:
        connections["default"].ensure_connection()
        caller = connections["default"].connection.info.backend_pid
        call_command("idempotency_relay", "--once", stdout=io.StringIO())
    finally:
        outbox.unregister(TOPIC)
    assert connections["default"].connection.info.backend_pid == caller
    assert live([caller]) == [caller]
    states = OutboxMessage.objects.filter(pk__in=ids).values_list("state", flat=True)
    assert set(states) == {OutboxState.SENT}


@pytest.mark.django_db(transaction=True, databases=["default", "replica"])
def test_a_relay_that_fails_to_close_does_not_keep_the_others_open(opened, settings):
    """Two databases; the marks of the second are refused by an error that is not an
    outage (a bug, a deployment mistake): the command still closes the first's relay
    (its marks written, its lease keeper's session ended), then raises the error."""
    settings.IDEMPOTENCY = {
        "OUTBOX_KICK": False,
        "OUTBOX_RELAY_LEASE": 3.0,  # the keeper renews (and connects) during the run
        "DATABASES": ["replica", "default"],
    }
    with transaction.atomic(using="default"):
        outbox.enqueue(TOPIC, {"n": 0})
    with transaction.atomic(using="replica"):
        replica_ids = [outbox.enqueue(REPLICA, {"n": i}, using="replica").pk for i in range(2)]
    renewed = threading.Event()

    def on_connect(sender: object, connection: Any, **kwargs: object) -> None:
        if connection.alias == "replica" and threading.current_thread().name == KEEPER:
            renewed.set()

    def on_replica(message: OutboxMessage, dedup_key: str) -> None:
        if message.pk == replica_ids[1]:
            assert renewed.wait(30)  # the replica's keeper renewed the lease (connected)

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "SET state = 'sent'" in sql:
            raise ProgrammingError("marks refused")
        return execute(sql, params, many, context)

    outbox.register(TOPIC)(lambda message, key: None)
    outbox.register(REPLICA)(on_replica)
    connection_created.connect(on_connect)
    try:
        with (
            connections["default"].execute_wrapper(refuse),
            pytest.raises(ProgrammingError, match="marks refused"),
        ):
            call_command("idempotency_relay", "--once", stdout=io.StringIO())
        keepers = [
            pid for thread, w, pid in opened.seen if thread == KEEPER and w.alias == "replica"
        ]
        assert keepers  # the replica's keeper had connected
        wait_for(lambda: not live(keepers), timeout=10)
        assert KEEPER not in {thread.name for thread in threading.enumerate()}
    finally:
        connection_created.disconnect(on_connect)
        outbox.unregister(TOPIC)
        outbox.unregister(REPLICA)
    sent = OutboxMessage.objects.using("replica").filter(pk__in=replica_ids)
    assert set(sent.values_list("state", flat=True)) == {OutboxState.SENT}
