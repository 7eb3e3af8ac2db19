"""The Celery app of the worker processes of tests/integration/test_inbox_celery_workers.py.

Run as ``celery -A tests.support.inbox_worker worker`` with ``DATABASE_URL`` naming the test
database and ``INBOX_BROKER_URL``, ``INBOX_QUEUE`` (also the prefix of this app's own
unacked-message keys in Redis, so its short visibility timeout never restores another
app's messages), ``INBOX_BLOCK`` (a file: while it exists, the next body to start
removes it and then blocks until the worker is killed) and ``INBOX_FLAKY`` (a file:
the first ``flaky`` body creates it and raises, so Celery's autoretry runs it again).
Each body prints ``INBOX start <event id> <pid>`` after its write.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from celery import Celery  # noqa: E402

from django_idempotency.inbox.celery import idempotent_shared_task  # noqa: E402
from tests.support.testapp.models import Widget  # noqa: E402

QUEUE = os.environ["INBOX_QUEUE"]
LEASE = 3.0  # seconds: a killed worker's claim is taken over this long after its start

app = Celery("django-idempotency-inbox-workers")
app.conf.update(
    broker_url=os.environ["INBOX_BROKER_URL"],
    result_backend=os.environ["INBOX_BROKER_URL"],
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_transport_options={
        # A message a killed worker never acknowledged is delivered again a second
        # after it was taken, by the next worker to poll (kombu's Redis transport).
        "visibility_timeout": 1,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "unacked_key": f"{QUEUE}-unacked",
        "unacked_index_key": f"{QUEUE}-unacked-index",
        "unacked_mutex_key": f"{QUEUE}-unacked-mutex",
    },
)


def _started(event_id: str) -> None:
    print(f"INBOX start {event_id} {os.getpid()}", flush=True)


@idempotent_shared_task(key="event_id", name="tests.inbox.provision", acks_late=True, lease=LEASE)
def provision(event_id: str, size: int) -> dict[str, int]:
    widget = Widget.objects.create(name=event_id, size=size)
    block = Path(os.environ["INBOX_BLOCK"])
    blocking = block.exists()
    if blocking:
        block.unlink()
    _started(event_id)
    if blocking:
        threading.Event().wait()  # mid-task, the write uncommitted, until SIGKILL
    return {"size": size, "widget": widget.pk}


@idempotent_shared_task(
    key="event_id",
    name="tests.inbox.flaky",
    acks_late=True,
    autoretry_for=(RuntimeError,),
    default_retry_delay=0,
    max_retries=3,
    lease=LEASE,
)
def flaky(event_id: str) -> str:
    Widget.objects.create(name=event_id)
    _started(event_id)
    mark = Path(os.environ["INBOX_FLAKY"])
    if not mark.exists():
        mark.touch()
        raise RuntimeError("the first attempt fails")
    return "done"
