"""The relay and the sweeper outlive the database (docs/operations.md, "Outages and
stopping"): an outage is logged once when it starts and once when it ends, retried with
backoff, and what was delivered before it is marked once the database is back.

The command runs in a real process whose connection goes through a fault proxy
(tests/support/faults.py): cutting it drops the connections and refuses new ones, as a server
restart does, without disturbing the real server that other tests share. The real
restart is ``test_the_relay_command_rides_out_a_real_server_restart`` (opt-in:
``--pg-restart``).
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from django_idempotency import tasks
from django_idempotency.models import OutboxMessage
from django_idempotency.outbox import relay
from tests.support.faults import extra_alias, terminate, unreachable, wait_for
from tests.support.outages import outage_lines, proxy
from tests.support.relay_process import PENDING, SENT, child, enqueue, states

__all__ = ["child", "extra_alias", "proxy"]  # the fixtures, used here

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def delivered(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("delivered")]


def test_the_relay_command_rides_out_a_database_outage(child, proxy, settings):
    """The database goes away while a batch's marks wait (connections dropped, new
    ones refused) and comes back: the relay logs one error when the outage starts and
    one line when it ends, never a traceback; it marks the messages it had delivered
    before (their lease still holds: nobody delivers them again), delivers what was
    enqueued meanwhile, and still stops with status 0 on SIGTERM."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(2)
    relay_process = child(
        [ids[1]],
        "--interval",
        "0.05",
        env={"RELAY_DB_PORT": str(proxy.port), "RELAY_LOG": "DEBUG"},
    )
    relay_process.wait_for_line(f"delivered {ids[1]}")
    proxy.cut()
    relay_process.release(ids[1])  # its mark and the first one's wait for the database
    relay_process.wait_for_log("still unavailable (try 3)")
    assert states(ids) == [(PENDING, 1)] * 2
    more = enqueue(1)
    proxy.restore()
    wait_for(lambda: states(ids + more) == [(SENT, 1)] * 3)
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()

    assert delivered(relay_process.lines) == ids + more  # each once
    started, ended = outage_lines(relay_process.log)
    assert len(started) == 1 and started[0].startswith("ERROR django_idempotency.outbox:")
    assert "outbox relay: database 'default' unavailable (OperationalError:" in started[0]
    assert len(ended) == 1 and ended[0].startswith("INFO ")
    assert "Traceback" not in relay_process.stderr()
    assert "Handled 3 outbox messages." in relay_process.lines


def test_the_relay_command_starts_before_the_database_is_up(child, proxy, settings):
    """Started while the database is unreachable, the relay waits for it (one error
    line), then delivers."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    proxy.cut()
    ids = enqueue(1)
    relay_process = child(
        [], "--interval", "0.05", env={"RELAY_DB_PORT": str(proxy.port), "RELAY_LOG": "INFO"}
    )
    relay_process.wait_for_log("outbox relay: database 'default' unavailable")
    proxy.restore()
    wait_for(lambda: states(ids) == [(SENT, 1)])
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()
    started, ended = outage_lines(relay_process.log)
    assert len(started) == len(ended) == 1


def test_once_reports_an_unreachable_database_in_one_line(child, proxy, settings):
    """``--once`` (cron) does not wait for the database: it exits 1 with one line saying
    which database is unavailable, not a traceback."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    proxy.cut()
    relay_process = child([], "--once", env={"RELAY_DB_PORT": str(proxy.port)})
    assert relay_process.exit_status() == 1
    assert "CommandError: database 'default' unavailable:" in relay_process.stderr()
    assert "Traceback" not in relay_process.stderr()


# A handler whose database session dies (the server restarted under it, its backend
# terminated) fails alone: the relay and the handlers after it get a fresh connection.


def _handler_losing_its_session(first: int, seen: list[tuple[int, bool]], barrier: Any) -> Any:
    def handler(message: OutboxMessage, key: str) -> None:
        if barrier is not None:
            barrier.wait()  # with a pool: both threads take part in every round
        if message.pk == first:
            connection.ensure_connection()
            terminate(connection.connection.info.backend_pid)
        try:
            OutboxMessage.objects.filter(pk=message.pk).exists()
        except DatabaseError:
            seen.append((message.pk, False))
            raise
        seen.append((message.pk, True))

    return handler


@pytest.mark.parametrize("threads", [1, 2])
def test_a_handler_whose_session_dies_fails_alone(settings, threads):
    """The first handler's database session is terminated: that message is retried
    later; the relay records it and every later handler, on the same thread too, runs
    on a fresh connection and is delivered."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    from django_idempotency import outbox

    with transaction.atomic():
        ids = [outbox.enqueue("outages.session", {"n": n}).pk for n in range(6)]
    seen: list[tuple[int, bool]] = []
    barrier = threading.Barrier(2, timeout=30) if threads == 2 else None
    outbox.register("outages.session")(_handler_losing_its_session(ids[0], seen, barrier))
    try:
        assert relay.deliver_batch(10, threads=threads) == 6
    finally:
        if barrier is not None:
            barrier.abort()
        outbox.unregister("outages.session")
    assert sorted(seen) == [(ids[0], False)] + [(pk, True) for pk in ids[1:]]
    assert states(ids) == [(PENDING, 1)] + [(SENT, 1)] * 5
    assert "terminating connection" in OutboxMessage.objects.get(pk=ids[0]).last_error


# The Celery tasks: a beat runs them again, so a run that meets an outage logs it (once
# for the whole outage, in this worker process) and returns; the next run retries.


@pytest.fixture
def own_backend() -> Iterator[int]:
    """This thread's database session; terminated by the test, reconnected after."""
    connection.ensure_connection()
    yield connection.connection.info.backend_pid
    connection.close()


def test_the_relay_task_logs_an_outage_once_and_the_next_run_delivers(
    own_backend, settings, caplog
):
    """The relay task's connection is killed (a server restart, a terminated backend):
    that run logs one error and returns 0 instead of raising; the next run reconnects,
    delivers, and logs that the database is back."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    caplog.set_level(logging.INFO, logger="django_idempotency.outbox")
    from django_idempotency import outbox

    seen: list[int] = []
    outbox.register("outages.topic")(lambda message, key: seen.append(message.pk))
    try:
        with transaction.atomic():
            pk = outbox.enqueue("outages.topic", {}).pk
        terminate(own_backend)
        assert tasks.relay_outbox() == 0
        assert tasks.relay_outbox() == 1
    finally:
        outbox.unregister("outages.topic")
    assert seen == [pk]
    started, ended = outage_lines(caplog.messages)
    assert len(started) == 1 and "the next run retries" in started[0]
    assert len(ended) == 1
    assert not any(record.exc_info for record in caplog.records)


def test_the_sweep_task_logs_an_outage_once_and_reports_it(own_backend, caplog):
    """The sweep task meets a dead connection: it returns the database's error in its
    report and logs it once; the next run sweeps."""
    caplog.set_level(logging.INFO, logger="django_idempotency")
    terminate(own_backend)
    report = tasks.sweep()
    assert report["database"] == "default" and "terminating connection" in str(report["error"])
    again = tasks.sweep()
    assert "error" not in again and again["database"] == "default"
    started, ended = outage_lines(caplog.messages)
    assert len(started) == 1 and "idempotency sweep task" in started[0]
    assert len(ended) == 1


def test_an_unavailable_database_does_not_hold_the_others_back(
    extra_alias, settings, caplog, monkeypatch
):
    """The relay command, the relay task and the sweep task cover two databases, one
    unreachable: the other is delivered and swept, the unreachable one is logged and
    reported."""
    from django_idempotency import outbox
    from django_idempotency.management.commands import idempotency_relay

    down = extra_alias(**unreachable(on_postgres=True))
    monkeypatch.setattr(tasks, "all_databases", lambda: (down, "default"))
    monkeypatch.setattr(idempotency_relay, "all_databases", lambda: (down, "default"))
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    seen: list[int] = []
    outbox.register("outages.topic")(lambda message, key: seen.append(message.pk))
    try:
        with transaction.atomic():
            first = outbox.enqueue("outages.topic", {}).pk
        out = io.StringIO()
        with pytest.raises(CommandError, match=f"database '{down}' unavailable"):
            call_command("idempotency_relay", "--once", stdout=out)
        assert out.getvalue() == (
            "Handled 1 outbox message.\n1 delivered, 0 failed (retried later), 0 dead-lettered.\n"
        )
        with transaction.atomic():
            second = outbox.enqueue("outages.topic", {}).pk
        assert tasks.relay_outbox() == 1
    finally:
        outbox.unregister("outages.topic")
    assert seen == [first, second]
    reports = tasks.sweep()["databases"]
    assert [r["database"] for r in reports] == [down, "default"]
    assert "error" in reports[0] and "error" not in reports[1]
    started, _ended = outage_lines(caplog.messages)
    assert len(started) == 2 and all(repr(down) in line for line in started)


# A real server restart, opt-in (--pg-restart): it disturbs every other PostgreSQL
# client of the machine.


@pytest.mark.pg_restart
def test_the_relay_command_rides_out_a_real_server_restart(child, settings):
    """``pg_ctlcluster ... restart`` while the relay runs: one error line, one line when
    the server is back, and delivery goes on."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(1)
    relay_process = child([], "--interval", "0.05", env={"RELAY_LOG": "INFO"})
    wait_for(lambda: states(ids) == [(SENT, 1)])
    version = sorted(os.listdir("/etc/postgresql"))[0]
    ctl = shutil.which("pg_ctlcluster")
    assert ctl, "pg_ctlcluster not found"
    subprocess.run(
        [ctl, "--skip-systemctl-redirect", version, "main", "restart"], check=True, timeout=120
    )
    connection.close()  # ours died with the server
    relay_process.wait_for_log("outbox relay: database 'default' unavailable")
    more = wait_for(lambda: _enqueue_when_up(), timeout=60)
    wait_for(lambda: states(more) == [(SENT, 1)], timeout=60)
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()
    started, ended = outage_lines(relay_process.log)
    assert len(started) == len(ended) == 1
    assert "Traceback" not in relay_process.stderr()


def _enqueue_when_up() -> list[int] | None:
    try:
        return enqueue(1)
    except Exception:
        connection.close()
        return None


def test_the_relay_command_backs_off_while_the_database_is_down(child, proxy, settings):
    """While the database refuses connections the relay waits longer after each failed
    try (0.25 to 0.5 s, then 0.5 to 1 s, then 1 to 2 s...), not a tight loop of
    connection attempts: the database back just after the third try, the line that ends
    the outage counts three or four failed tries, not hundreds."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    proxy.cut()
    ids = enqueue(1)
    relay_process = child(
        [], "--interval", "0.05", env={"RELAY_DB_PORT": str(proxy.port), "RELAY_LOG": "DEBUG"}
    )
    relay_process.wait_for_log("still unavailable (try 3)")
    proxy.restore()  # the fourth try comes a second or more after the third
    wait_for(lambda: states(ids) == [(SENT, 1)])
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()
    _started, ended = outage_lines(relay_process.log)
    assert len(ended) == 1
    tries = int(ended[0].rsplit("(", 1)[1].split()[0])
    assert 3 <= tries <= 4, ended[0]
