"""Idempotent Celery tasks on real workers and a real broker (Redis, 127.0.0.1:6379).

The workers are processes of their own (``celery -A tests.support.inbox_worker worker``,
tests/support/inbox_worker.py) with ``acks_late`` tasks. A worker killed with SIGKILL mid-task
leaves its message unacknowledged and its claim uncommitted work: the broker delivers
the task again to the next worker, which finds the key in flight, retries after the
lease, takes the claim over and runs the body; its writes happen once. A duplicate
task with the same key gets the stored return value without running the body; a body
that raises releases the key, so Celery's autoretry runs it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from django_idempotency.models import IdempotencyRecord, RecordState
from tests.support.pgbouncer import database_url, pgbouncer_port
from tests.support.redis import REDIS_HOST, REDIS_PORT, redis_unreachable
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
BROKER = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"
TIMEOUT = 60  # seconds any one step may take before the test fails


class Worker:
    """One worker process; a thread reads its output and signals the lines we wait for."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.started: dict[str, threading.Semaphore] = {}
        self._lock = threading.Lock()
        command = [sys.executable, "-m", "celery", "-A", "tests.support.inbox_worker", "worker",
                   "--pool", "solo", "-n", f"inbox-{uuid.uuid4().hex[:6]}@%h",
                   "--without-gossip", "--without-mingle", "--without-heartbeat",
                   "--loglevel", "INFO"]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def semaphore(self, event_id: str) -> threading.Semaphore:
        with self._lock:
            return self.started.setdefault(event_id, threading.Semaphore(0))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if " ready." in line:
                self.ready.set()
            if "INBOX start " in line:
                self.semaphore(line.split("INBOX start ", 1)[1].split()[0]).release()

    def kill(self) -> None:
        if self.process.stdout is not None and self.process.stdout.closed:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(TIMEOUT)
        self._close()

    def _close(self) -> None:
        self.reader.join(TIMEOUT)  # the pipe ends with the process
        assert self.process.stdout is not None
        self.process.stdout.close()

    def stop(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            return
        self._close()

    def output(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    reason = redis_unreachable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}, but CI runs Redis (.ci/run)")
        pytest.skip(reason)
    values = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    values.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database_url(),
        INBOX_BROKER_URL=BROKER,
        INBOX_QUEUE=f"django-idempotency-inbox-{uuid.uuid4().hex}",
        INBOX_BLOCK=str(tmp_path / "block"),
        INBOX_FLAKY=str(tmp_path / "flaky"),
    )
    return values


@pytest.fixture
def sender(env: dict[str, str]) -> Iterator[Any]:
    from celery import Celery

    app = Celery("django-idempotency-inbox-sender", set_as_current=False)
    app.conf.update(broker_url=BROKER, result_backend=BROKER,
                    broker_connection_retry_on_startup=True,
                    task_default_queue=env["INBOX_QUEUE"])  # fmt: skip
    yield app
    app.close()


@pytest.fixture
def workers(env: dict[str, str]) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def start(workers: list[Worker], env: dict[str, str]) -> Worker:
    worker = Worker(env)
    workers.append(worker)
    assert worker.ready.wait(TIMEOUT), worker.output()
    return worker


def test_a_worker_killed_mid_task_runs_the_body_writes_once(env, sender, workers):
    Path(env["INBOX_BLOCK"]).touch()  # the first body to start blocks until killed
    first = start(workers, env)
    result = sender.send_task("tests.inbox.provision", args=("evt-kill", 7))
    assert first.semaphore("evt-kill").acquire(timeout=TIMEOUT), first.output()
    assert not Path(env["INBOX_BLOCK"]).exists()
    first.kill()  # SIGKILL mid-task: its transaction (the Widget row) never commits
    assert Widget.objects.filter(name="evt-kill").count() == 0
    assert IdempotencyRecord.objects.get(key="evt-kill").state == RecordState.CLAIMED

    second = start(workers, env)  # acks_late: the broker delivers the task again
    value = result.get(timeout=TIMEOUT)
    assert second.semaphore("evt-kill").acquire(timeout=TIMEOUT), second.output()
    widget = Widget.objects.get(name="evt-kill")  # written once, by the second worker
    assert value == {"size": 7, "widget": widget.pk}
    record = IdempotencyRecord.objects.get(key="evt-kill")
    assert record.state == RecordState.COMPLETED
    assert (record.principal, record.endpoint) == ("celery", "task:tests.inbox.provision")
    # The killed worker's claim was taken over: at once when its presence lock went with
    # its session (a direct connection), after the lease otherwise (behind a pooler,
    # where the second worker first finds it in flight and retries).
    if pgbouncer_port() is not None:
        assert "in progress" in second.output()

    duplicate = sender.send_task("tests.inbox.provision", args=("evt-kill", 7))
    assert duplicate.get(timeout=TIMEOUT) == value  # the stored value, body not run
    assert not second.semaphore("evt-kill").acquire(blocking=False)
    assert Widget.objects.filter(name="evt-kill").count() == 1


def test_a_task_that_raises_releases_its_key_and_celerys_retry_runs_it(env, sender, workers):
    worker = start(workers, env)
    result = sender.send_task("tests.inbox.flaky", args=("evt-flaky",))
    assert result.get(timeout=TIMEOUT) == "done"
    assert worker.semaphore("evt-flaky").acquire(timeout=0)  # the failed attempt
    assert worker.semaphore("evt-flaky").acquire(timeout=0)  # the retry
    assert Widget.objects.filter(name="evt-flaky").count() == 1  # the first rolled back
    again = sender.send_task("tests.inbox.flaky", args=("evt-flaky",))
    assert again.get(timeout=TIMEOUT) == "done"
    assert not worker.semaphore("evt-flaky").acquire(blocking=False)
