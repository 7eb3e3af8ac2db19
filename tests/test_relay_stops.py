"""However the relay stops, what its handlers delivered is marked sent (docs/outbox.md,
"Stopping"): an exception in a handler or in the relay's thread, Ctrl-C, SIGTERM; what
no handler started is handed back, due at once.

The command runs in a real process that gets real signals; each test waits for what
the process reports (a handler entered, the signal handled), never for a time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from django_idempotency import outbox
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from tests.faults import wait_for
from tests.test_relay import db_now

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)

# A relay command (or COMMAND_NAME) in a process of its own. argv: database name,
# OUTBOX_MARK_DELAY, the ids whose handler blocks until the test writes "release <id>",
# then the command's arguments, run as manage.py runs them. It reports "delivered <id>"
# when a handler starts, "signalled <n>" once the command's own handler of signal n has
# run, and "exited" after the command.
COMMAND = """
import os, signal, sys, threading
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
from django.conf import settings
from django.core.management import execute_from_command_line
from django.db import connections

connections["default"].settings_dict["NAME"] = sys.argv[1]
if os.environ.get("RELAY_DB_PORT"):  # through a fault proxy (tests/faults.py)
    connections["default"].settings_dict.update(
        HOST="127.0.0.1", PORT=os.environ["RELAY_DB_PORT"], OPTIONS={"connect_timeout": 5}
    )
if os.environ.get("RELAY_LOG"):
    import logging

    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("django_idempotency").setLevel(os.environ["RELAY_LOG"])
settings.IDEMPOTENCY = {"OUTBOX_KICK": False, "OUTBOX_MARK_DELAY": float(sys.argv[2])}
from django_idempotency import outbox

blocked = {int(pk) for pk in sys.argv[3].split(",") if pk}
released = {pk: threading.Event() for pk in blocked}


def say(*words):
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())


def listen():
    for line in sys.stdin:
        released[int(line.split()[1])].set()


threading.Thread(target=listen, daemon=True).start()


@outbox.handler("stops.topic")
def deliver(message, dedup_key):
    say("delivered", message.pk)
    if message.pk in blocked:
        released[message.pk].wait()


installed = signal.signal


def spy(signum, handler):
    if signum == signal.SIGTERM and callable(handler):
        inner = handler

        def handler(number, frame):
            try:
                inner(number, frame)
            finally:
                say("signalled", number)

    return installed(signum, handler)


signal.signal = spy


def on_sigint(number, frame):
    say("signalled", number)
    raise KeyboardInterrupt


installed(signal.SIGINT, on_sigint)
name = os.environ.get("COMMAND_NAME", "idempotency_relay")
execute_from_command_line(["manage.py", name, *sys.argv[4:]])
say("exited")
"""


class Child:
    """The relay command's process: its reports line by line, its log, and its stdin.

    Args:
        blocked: ids whose handler waits for :meth:`release`.
        args: the command's arguments.
        mark_delay: its ``OUTBOX_MARK_DELAY``.
        env: extra environment (``RELAY_DB_PORT``: connect there; ``RELAY_LOG``: the
            level of the ``django_idempotency`` loggers, written to stderr;
            ``COMMAND_NAME``: another command than ``idempotency_relay``).
    """

    def __init__(
        self,
        blocked: list[int],
        *args: str,
        mark_delay: float = 3600.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                COMMAND,
                connection.settings_dict["NAME"],
                str(mark_delay),
                ",".join(map(str, blocked)),
                *args,
            ],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.log: list[str] = []
        # Both pipes drained all along, so the child never blocks writing to them.
        self._readers = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in ((self.process.stdout, self.lines), (self.process.stderr, self.log))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def _join(self) -> None:
        for reader in self._readers:
            reader.join(30)

    def wait_for_line(self, line: str) -> None:
        """Wait until the process reported ``line`` (its own progress, not a clock)."""

        def reported() -> bool:
            if line in self.lines:
                return True
            if self.process.poll() is not None:
                self._join()
                if line not in self.lines:
                    raise AssertionError(f"{line!r} never came: {self.lines}, {self.stderr()}")
            return line in self.lines

        wait_for(reported, timeout=60)

    def wait_for_log(self, text: str) -> str:
        """The first log line containing ``text``, once the process has written it."""
        return wait_for(lambda: next((line for line in self.log if text in line), None))

    def release(self, pk: int) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"release {pk}\n")
        self.process.stdin.flush()

    def signal(self, number: int) -> None:
        os.kill(self.process.pid, number)

    def finish(self) -> int:
        self.wait_for_line("exited")
        status = self.process.wait(30)
        self._join()
        return status

    def exit_status(self) -> int:
        """The status of a process that ends by itself (not reporting "exited")."""
        status = self.process.wait(60)
        self._join()
        return status

    def stderr(self) -> str:
        return "\n".join(self.log)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._join()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def child() -> Iterator[Any]:
    made: list[Child] = []

    def start(blocked: list[int], *args: str, **kwargs: Any) -> Child:
        made.append(Child(blocked, *args, **kwargs))
        return made[-1]

    yield start
    for each in made:
        each.close()


def enqueue(n: int) -> list[int]:
    with transaction.atomic():
        return [outbox.enqueue("stops.topic", {"n": i}).pk for i in range(n)]


def states(ids: list[int]) -> list[tuple[str, int]]:
    rows = dict(OutboxMessage.objects.filter(pk__in=ids).values_list("pk", "state"))
    attempts = dict(OutboxMessage.objects.filter(pk__in=ids).values_list("pk", "attempts"))
    return [(rows[pk], attempts[pk]) for pk in ids]


def assert_handed_back(ids: list[int]) -> None:
    """Due at once, the claim's attempt undone: another relay delivers them now."""
    now = db_now()
    for message in OutboxMessage.objects.filter(pk__in=ids):
        assert (message.state, message.attempts) == (OutboxState.PENDING, 0)
        assert message.available_at <= now


SENT, PENDING = OutboxState.SENT, OutboxState.PENDING


@pytest.mark.parametrize("threads", ["1", "2"])
def test_sigterm_stops_the_relay_after_its_running_handlers_and_marks_them(
    child, settings, threads
):
    """``kill`` (SIGTERM) while handlers run: they finish, every delivered message is
    marked sent, the messages not started are handed back (with a pool, at once, while
    its handlers still run), and the command exits 0."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(5)
    running = ids[1:2] if threads == "1" else ids[1:3]
    relay_process = child(running, "--threads", threads, "--batch-size", "10")
    for pk in running:
        relay_process.wait_for_line(f"delivered {pk}")
    relay_process.signal(signal.SIGTERM)
    relay_process.wait_for_line(f"signalled {signal.SIGTERM}")
    done = 1 + len(running)
    if threads != "1":  # the relay's thread is free: the rest goes back at once
        wait_for(lambda: set(states(ids[done:])) == {(PENDING, 0)})
    for pk in running:
        relay_process.release(pk)
    assert relay_process.finish() == 0, relay_process.stderr()

    assert f"Handled {done} outbox messages." in relay_process.lines
    assert states(ids[:done]) == [(SENT, 1)] * done
    assert_handed_back(ids[done:])
    # Each delivered once; a pool's handlers finish in any order.
    assert sorted(line for line in relay_process.lines if line.startswith("delivered")) == sorted(
        f"delivered {pk}" for pk in ids[:done]
    )


def test_sigterm_ends_the_wait_between_polls_at_once(child, settings):
    """Caught up and sleeping its ``--interval`` (an hour here), the relay exits 0 as
    soon as it gets SIGTERM, its marks written."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(2)
    relay_process = child([], "--interval", "3600")
    wait_for(lambda: states(ids) == [(SENT, 1)] * 2)
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()
    assert "Handled 2 outbox messages." in relay_process.lines


def test_a_second_sigterm_stops_the_relay_at_once(child, settings):
    """A handler that does not finish: the second SIGTERM interrupts it. Its message
    stays leased (delivered again after the lease), the one delivered before is
    marked, the rest is handed back, and the command still exits 0."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(4)
    relay_process = child([ids[1]], "--batch-size", "10")
    relay_process.wait_for_line(f"delivered {ids[1]}")
    relay_process.signal(signal.SIGTERM)
    relay_process.wait_for_line(f"signalled {signal.SIGTERM}")
    relay_process.lines.remove(f"signalled {signal.SIGTERM}")
    relay_process.signal(signal.SIGTERM)
    assert relay_process.finish() == 0, relay_process.stderr()
    assert states(ids[:2]) == [(SENT, 1), (PENDING, 1)]
    assert_handed_back(ids[2:])


def test_ctrl_c_while_the_relay_waits_on_its_pool_marks_what_the_pool_delivered(child, settings):
    """Ctrl-C (SIGINT) reaches the relay's thread while it waits for its pool: the
    handlers running finish, and the messages they delivered are marked sent, like
    the one delivered before; the messages not started are handed back."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(5)
    relay_process = child(ids[1:3], "--threads", "2", "--batch-size", "10")
    for pk in ids[1:3]:
        relay_process.wait_for_line(f"delivered {pk}")
    relay_process.signal(signal.SIGINT)
    relay_process.wait_for_line(f"signalled {signal.SIGINT}")
    for pk in ids[1:3]:
        relay_process.release(pk)  # they return while the relay is stopping
    assert relay_process.finish() == 0, relay_process.stderr()

    assert states(ids[:3]) == [(SENT, 1)] * 3
    assert_handed_back(ids[3:])
    assert "Handled 3 outbox messages." in relay_process.lines


@pytest.fixture
def handler() -> Iterator[list[Any]]:
    calls: list[Any] = []
    yield calls
    outbox.unregister("stops.topic")


def test_a_pool_handler_raising_system_exit_leaves_no_delivered_message_unmarked(handler, settings):
    """``sys.exit()`` in one pool handler stops the relay: the handler running beside
    it finishes and its message is marked sent; the messages not started are handed
    back; the one that raised stays leased; ``SystemExit`` propagates."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(5)

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        handler.append(message.pk)
        if message.pk == ids[0]:
            wait_for(lambda: ids[1] in handler)
            raise SystemExit("stop the worker")
        if message.pk == ids[1]:
            # Returns only once the relay is stopping: the rest was handed back.
            wait_for(lambda: set(states(ids[2:])) == {(PENDING, 0)}, timeout=10)

    outbox.register("stops.topic")(deliver)
    with pytest.raises(SystemExit):
        relay.deliver_batch(10, threads=2)
    assert handler == ids[:2]
    assert states(ids[:2]) == [(PENDING, 1), (SENT, 1)]
    assert_handed_back(ids[2:])


def test_a_soft_time_limit_inside_a_handler_stops_the_batch(handler, settings):
    """An exception type in ``stop_on`` (the Celery task passes ``SoftTimeLimitExceeded``)
    raised inside a handler ends the run: that attempt is recorded as failed, the
    delivered message is marked, the rest is handed back, and the exception
    propagates instead of the next handler starting."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(4)

    class TimeLimit(Exception):
        pass

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        handler.append(message.pk)
        if message.pk == ids[1]:
            raise TimeLimit("soft time limit")

    outbox.register("stops.topic")(deliver)
    with pytest.raises(TimeLimit):
        relay.deliver_due(10, stop_on=(TimeLimit,))
    assert handler == ids[:2]
    assert states(ids[:2]) == [(SENT, 1), (PENDING, 1)]
    assert "soft time limit" in OutboxMessage.objects.get(pk=ids[1]).last_error
    assert_handed_back(ids[2:])


def test_stop_from_another_thread_ends_the_batch_after_the_running_handler(handler, settings):
    """``Relay.stop()``: the running handler finishes and is marked, the rest of the
    batch is handed back, and the relay claims nothing more."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    ids = enqueue(4)
    one = relay.Relay()
    entered, proceed = threading.Event(), threading.Event()

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        handler.append(message.pk)
        if message.pk == ids[1]:
            entered.set()
            assert proceed.wait(30)

    outbox.register("stops.topic")(deliver)
    stopper = threading.Thread(target=lambda: (entered.wait(30), one.stop(), proceed.set()))
    stopper.start()
    with one:
        assert one.deliver_batch(10) == 2
        assert one.deliver_batch(10) == 0
    stopper.join(30)
    assert handler == ids[:2]
    assert states(ids[:2]) == [(SENT, 1)] * 2
    assert_handed_back(ids[2:])
