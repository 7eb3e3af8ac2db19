"""Many relays: four Celery worker processes on a real Redis broker share one burst.

Each worker is its own process with its own database connection (through PgBouncer in
the pooler pass, docs/testing.md). The relay claims with ``FOR UPDATE SKIP LOCKED``
under a lease, so every message is delivered, and none by two workers while its lease
is live: the handler (tests/support/relay_worker.py) logs message id, dedup key and pid.
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
from django.db import transaction

from django_idempotency import outbox
from django_idempotency.models import OutboxMessage, OutboxState
from tests.support.pgbouncer import database_url
from tests.support.redis import REDIS_HOST, REDIS_PORT, redis_unreachable

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.pooled]

WORKERS = 4
TASKS = 8
MESSAGES = 200
ROOT = Path(__file__).resolve().parents[2]


def worker_command(n: int) -> list[str]:
    name = f"relay{n}-{uuid.uuid4().hex[:6]}@%h"
    quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return [sys.executable, "-m", "celery", "-A", "tests.support.relay_worker", "worker", "--pool",
            "solo", "-n", name, *quiet, "--loglevel", "INFO"]  # fmt: skip


class Workers:
    """Worker processes whose merged output is read by one thread each."""

    def __init__(self, env: dict[str, str]) -> None:
        self.ready = threading.Semaphore(0)
        self.finished = threading.Event()
        self.succeeded = 0
        self.logs: list[list[str]] = []
        self._lock = threading.Lock()
        self.processes = [
            subprocess.Popen(
                worker_command(n),
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            for n in range(WORKERS)
        ]
        self.readers = []
        for process in self.processes:
            lines: list[str] = []
            self.logs.append(lines)
            reader = threading.Thread(target=self._read, args=(process, lines), daemon=True)
            reader.start()
            self.readers.append(reader)

    def _read(self, process: subprocess.Popen[str], lines: list[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if " ready." in line:
                self.ready.release()
            if "django_idempotency.relay_outbox" in line and "succeeded" in line:
                with self._lock:
                    self.succeeded += 1
                    if self.succeeded == TASKS:
                        self.finished.set()

    def wait_ready(self, timeout: float) -> bool:
        return all(self.ready.acquire(timeout=timeout) for _ in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for reader, process in zip(self.readers, self.processes, strict=True):
            reader.join(30)  # the pipe ends with the process
            assert process.stdout is not None
            process.stdout.close()

    def output(self) -> str:
        return "".join(line for lines in self.logs for line in lines)


@pytest.fixture
def queue() -> str:
    reason = redis_unreachable()
    if reason:
        pytest.skip(reason)
    return f"django-idempotency-relays-{uuid.uuid4().hex}"


@pytest.fixture
def sender(queue: str) -> Iterator[Any]:
    """A Celery app on the workers' broker and queue, current while the test runs."""
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    app = Celery("django-idempotency-relay-sender", set_as_current=True)
    app.conf.update(
        broker_url=f"redis://{REDIS_HOST}:{REDIS_PORT}/0",
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
    )
    yield app
    previous.set_current()


def test_four_relay_workers_deliver_a_burst_once_each(tmp_path, settings, queue, sender):
    from django_idempotency import tasks

    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    with transaction.atomic():
        messages = [outbox.enqueue("topology.burst", {"n": n}) for n in range(MESSAGES)]
    log = tmp_path / "deliveries.log"
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database_url(),
        RELAY_BROKER_URL=f"redis://{REDIS_HOST}:{REDIS_PORT}/0",
        RELAY_QUEUE=queue,
        RELAY_DELIVERY_LOG=str(log),
    )
    workers = Workers(env)
    try:
        assert workers.wait_ready(60), workers.output()
        for _ in range(TASKS):  # each runs batches of 10 until one comes back short
            tasks.relay_outbox.apply_async(kwargs={"batch_size": 10, "max_batches": 100})
        assert workers.finished.wait(60), workers.output()
    finally:
        workers.stop()

    lines = [line.split() for line in log.read_text().splitlines()]
    delivered = sorted((int(pk), key) for pk, key, _pid in lines)
    assert delivered == sorted((m.pk, m.dedup_key) for m in messages)  # all, each once
    pids = {int(pid) for _pk, _key, pid in lines}
    assert pids <= {p.pid for p in workers.processes} and len(pids) >= 2
    states = OutboxMessage.objects.values_list("state", "attempts").distinct()
    assert list(states) == [(OutboxState.SENT, 1)]
