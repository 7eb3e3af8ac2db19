"""The Celery relay task, with a real worker consuming from Redis (127.0.0.1:6379)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

from django_idempotency import outbox, tasks
from django_idempotency.models import OutboxMessage, OutboxState
from tests.support.redis import REDIS_HOST, REDIS_PORT, redis_unreachable


@pytest.fixture
def received() -> Iterator[list[tuple[int, str]]]:
    seen: list[tuple[int, str]] = []
    outbox.register("celery.topic")(lambda message, key: seen.append((message.pk, key)))
    yield seen
    outbox.unregister("celery.topic")


@pytest.fixture
def celery_app() -> Iterator[Any]:
    """A Celery app on Redis with a queue of its own, current for the test's duration."""
    reason = redis_unreachable()
    if reason:
        if os.environ.get("CI"):  # .ci/run starts Redis: unreachable there is a failure
            pytest.fail(f"{reason}, but CI runs Redis (.ci/run)")
        pytest.skip(reason)
    from celery import Celery, current_app

    previous = current_app._get_current_object()
    app = Celery("django-idempotency-tests", set_as_current=True)
    app.conf.update(
        broker_url=f"redis://{REDIS_HOST}:{REDIS_PORT}/0",
        broker_connection_retry_on_startup=True,
        task_default_queue=f"django-idempotency-tests-{uuid.uuid4().hex}",
        worker_hijack_root_logger=False,
    )
    yield app
    previous.set_current()


@pytest.fixture
def finished_tasks(celery_app: Any) -> Iterator[threading.Event]:
    """Set when a relay task finished in the worker; closes the worker's connections."""
    from celery.signals import task_postrun

    done = threading.Event()

    def on_postrun(sender: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "name", "") == "django_idempotency.relay_outbox":
            connections.close_all()  # the worker thread's own connections
            done.set()

    task_postrun.connect(on_postrun, weak=False)
    yield done
    task_postrun.disconnect(on_postrun)


@pytest.mark.django_db(transaction=True)
def test_commit_kicks_a_real_worker_that_delivers(celery_app, finished_tasks, received):
    from celery.contrib.testing.worker import start_worker

    with start_worker(
        celery_app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=30
    ):
        with transaction.atomic():
            message = outbox.enqueue("celery.topic", {"worker": 1})
        # No explicit call: the on-commit kick sent the task to Redis.
        assert finished_tasks.wait(30), "the worker never ran django_idempotency.relay_outbox"

    assert received == [(message.pk, message.dedup_key)]
    message.refresh_from_db()
    assert message.state == OutboxState.SENT
    assert message.attempts == 1


@pytest.mark.django_db(transaction=True)
def test_beat_style_delay_delivers(celery_app, finished_tasks, received, settings):
    from celery.contrib.testing.worker import start_worker

    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    with transaction.atomic():
        messages = [outbox.enqueue("celery.topic", {"n": n}) for n in range(3)]
    assert OutboxMessage.objects.filter(state=OutboxState.PENDING).count() == 3
    with start_worker(
        celery_app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=30
    ):
        tasks.relay_outbox.delay(batch_size=2)
        assert finished_tasks.wait(30)
    assert sorted(received) == sorted((m.pk, m.dedup_key) for m in messages)
    assert OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 3


@pytest.mark.django_db
def test_task_body_runs_without_a_broker(received):
    with transaction.atomic():
        outbox.enqueue("celery.topic", {})
    assert tasks.relay_outbox() == 1
    assert tasks.relay_outbox.name == "django_idempotency.relay_outbox"
    assert len(received) == 1


@pytest.mark.django_db(transaction=True)
def test_the_task_runs_handlers_in_a_pool_with_threads(settings):
    """``relay_outbox(threads=n)``: n handlers at once (a barrier of n proves it)."""
    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    barrier = threading.Barrier(3, timeout=30)
    names: list[str] = []

    def handler(message: OutboxMessage, key: str) -> None:
        names.append(threading.current_thread().name)
        barrier.wait()

    outbox.register("celery.pool")(handler)
    try:
        with transaction.atomic():
            for n in range(3):
                outbox.enqueue("celery.pool", {"n": n})
        assert tasks.relay_outbox(batch_size=10, threads=3) == 3
    finally:
        barrier.abort()
        outbox.unregister("celery.pool")
    assert len(set(names)) == 3
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENT}


def test_the_package_does_not_need_celery():
    """Only tasks.py imports Celery: the rest imports with Celery unavailable."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['celery'] = None\n"
        "import os, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.settings'\n"
        "django.setup()\n"
        "from django_idempotency import outbox, admin\n"
        "from django_idempotency.outbox import relay\n"
        "from django_idempotency.protocol import phases\n"
        "from django.core.management import load_command_class\n"
        "load_command_class('django_idempotency', 'idempotency_relay')\n"
        "assert outbox.kick() is False\n"
        "try:\n"
        "    import django_idempotency.tasks\n"
        "except ImportError:\n"
        "    print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.django_db(transaction=True)
def test_the_soft_time_limit_stops_the_relay_task_with_nothing_left_unmarked(settings):
    """Celery's soft time limit raised inside a handler ends the task: the message
    delivered before is marked sent, the interrupted attempt is recorded as failed, the
    rest of the batch is handed back due at once, and the task raises the limit."""
    from celery.exceptions import SoftTimeLimitExceeded

    settings.IDEMPOTENCY = {"OUTBOX_KICK": False}
    seen: list[int] = []

    def handler(message: OutboxMessage, key: str) -> None:
        seen.append(message.pk)
        if len(seen) == 2:
            raise SoftTimeLimitExceeded()

    outbox.register("celery.limit")(handler)
    try:
        with transaction.atomic():
            ids = [outbox.enqueue("celery.limit", {"n": n}).pk for n in range(4)]
        with pytest.raises(SoftTimeLimitExceeded):
            tasks.relay_outbox(batch_size=10)
    finally:
        outbox.unregister("celery.limit")
    assert seen == ids[:2]
    rows = OutboxMessage.objects.filter(pk__in=ids).order_by("pk")
    assert list(rows.values_list("state", "attempts")) == [
        (OutboxState.SENT, 1),
        (OutboxState.PENDING, 1),
        (OutboxState.PENDING, 0),
        (OutboxState.PENDING, 0),
    ]
    assert "SoftTimeLimitExceeded" in rows[1].last_error
