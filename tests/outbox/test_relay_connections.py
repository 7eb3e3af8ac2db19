"""The relay command closes the database connections it opened when it returns
(docs/outbox.md, "Management command"): its own on the calling thread, its marks'
writer's, its pool threads'. A process that runs it and lives on (a Celery worker, a
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
from django.db import OperationalError, ProgrammingError, connections, transaction
from django.db.backends.signals import connection_created

from django_idempotency import outbox, signals
from django_idempotency.models import OutboxMessage, OutboxState
from tests.support.faults import admin_connection, wait_for
from tests.support.pgbouncer import NOT_POOLED

pytestmark = [pytest.mark.postgres, NOT_POOLED, pytest.mark.django_db(transaction=True)]

TOPIC = "connections.topic"
REPLICA = "connections.replica"
WRITER = "outbox-marks-writer"


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
    the marks' writer wrote the first mark (its connection is open, and its
    ``delivered`` receiver opened one to another alias), and the last one ends the
    command as ``end`` says: ``"sigterm"`` or ``"error"`` (``SystemExit``)."""

    def __init__(self, ids: list[int], end: str, pooled: bool) -> None:
        self.ids, self.end, self.pooled = ids, end, pooled
        self.written = threading.Event()
        self.together = threading.Barrier(2, timeout=30)

    def on_delivered(self, sender: str, **kwargs: object) -> None:
        if threading.current_thread().name == WRITER:
            connections["replica"].ensure_connection()  # a receiver using another alias
            self.written.set()

    def __call__(self, message: OutboxMessage, dedup_key: str) -> None:
        assert OutboxMessage.objects.filter(pk=message.pk).exists()
        if self.pooled:
            if message.pk in self.ids[:2]:
                self.together.wait()  # both pool threads run a handler (and connect)
            return
        if message.pk == self.ids[1]:
            assert self.written.wait(30)  # the writer wrote the first mark meanwhile
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
    calling thread's, the marks' writer's, the pool threads'."""
    if end == "sigterm" and threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGTERM is handled on the main thread only")
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MARK_DELAY": 0.05}
    ids = enqueue(4)
    handler = Handler(ids, end, pooled=end == "pool")
    outbox.register(TOPIC)(handler)
    signals.outbox_delivered.connect(handler.on_delivered)
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
        assert opened.threads() >= ({main, *pool} if end == "pool" else {main, WRITER})
        if end != "pool":
            assert {w.alias for t, w, _pid in opened.seen if t == WRITER} == {"default", "replica"}
        wait_for(lambda: not live(pids), timeout=10)  # the server ends each session
        assert all(wrapper.connection is None for _thread, wrapper, _pid in opened.seen)
    finally:
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
    """Two databases; the last marks of the first are refused by an error that is not
    an outage (a bug, a deployment mistake): the command still closes the second's
    relay (its marks written, its writer's session ended), then raises the error."""
    settings.IDEMPOTENCY = {
        "OUTBOX_KICK": False,
        "OUTBOX_MARK_DELAY": 0.05,
        "DATABASES": ["default", "replica"],
    }
    with transaction.atomic(using="default"):
        outbox.enqueue(TOPIC, {"n": 0})
    with transaction.atomic(using="replica"):
        replica_ids = [outbox.enqueue(REPLICA, {"n": i}, using="replica").pk for i in range(2)]
    written = threading.Event()

    def on_delivered(sender: str, **kwargs: object) -> None:
        if sender == REPLICA and threading.current_thread().name == WRITER:
            written.set()

    def on_replica(message: OutboxMessage, dedup_key: str) -> None:
        if message.pk == replica_ids[1]:
            assert written.wait(30)  # the replica's writer wrote the first mark (connected)

    def refuse(error: type[Exception]) -> Any:
        def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if "SET state = 'sent'" in sql:
                raise error("marks refused")
            return execute(sql, params, many, context)

        return wrapper

    def on_connect(sender: object, connection: Any, **kwargs: object) -> None:
        if connection.alias == "default" and threading.current_thread().name == WRITER:
            connection.execute_wrappers.append(refuse(OperationalError))  # retried

    outbox.register(TOPIC)(lambda message, key: None)
    outbox.register(REPLICA)(on_replica)
    signals.outbox_delivered.connect(on_delivered)
    connection_created.connect(on_connect)
    try:
        with (
            connections["default"].execute_wrapper(refuse(ProgrammingError)),
            pytest.raises(ProgrammingError, match="marks refused"),
        ):
            call_command("idempotency_relay", "--once", stdout=io.StringIO())
        writers = [
            pid for thread, w, pid in opened.seen if thread == WRITER and w.alias == "replica"
        ]
        assert writers  # the replica's writer had connected
        wait_for(lambda: not live(writers), timeout=10)
        assert WRITER not in {thread.name for thread in threading.enumerate()}
    finally:
        connection_created.disconnect(on_connect)
        signals.outbox_delivered.disconnect(on_delivered)
        outbox.unregister(TOPIC)
        outbox.unregister(REPLICA)
    sent = OutboxMessage.objects.using("replica").filter(pk__in=replica_ids)
    assert set(sent.values_list("state", flat=True)) == {OutboxState.SENT}
