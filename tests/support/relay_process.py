"""The relay command in a real process of its own, driven line by line (tests of how it stops)."""

from __future__ import annotations

import os
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
from tests.support.clocks import db_now
from tests.support.faults import wait_for

ROOT = Path(__file__).resolve().parents[2]

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
if os.environ.get("RELAY_DB_PORT"):  # through a fault proxy (tests/support/faults.py)
    connections["default"].settings_dict.update(
        HOST="127.0.0.1", PORT=os.environ["RELAY_DB_PORT"], OPTIONS={"connect_timeout": 5}
    )
if os.environ.get("RELAY_LOG"):
    import logging

    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("django_idempotency").setLevel(os.environ["RELAY_LOG"])
settings.IDEMPOTENCY = {
    "OUTBOX_KICK": False,
    "OUTBOX_MARK_DELAY": float(sys.argv[2]),
    "OUTBOX_RELAY_LEASE": float(os.environ.get("RELAY_LEASE", "120")),
}
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
            ``RELAY_LEASE``: its ``OUTBOX_RELAY_LEASE``;
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
