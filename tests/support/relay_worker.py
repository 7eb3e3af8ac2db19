"""The Celery app of the relay worker processes of tests/integration/test_relay_workers.py.

Run as ``celery -A tests.support.relay_worker worker`` with ``DATABASE_URL`` naming the test
database, ``RELAY_BROKER_URL``, ``RELAY_QUEUE`` and ``RELAY_DELIVERY_LOG``. The handler
of ``topology.burst`` appends one line per delivery to the log: message id, dedup key
and the worker's pid (one short ``O_APPEND`` write, so lines of several workers never
interleave).
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from celery import Celery  # noqa: E402

import django_idempotency.tasks  # noqa: E402, F401  (registers the relay task)
from django_idempotency import outbox  # noqa: E402
from django_idempotency.models import OutboxMessage  # noqa: E402

app = Celery("django-idempotency-relay-workers")
app.conf.update(
    broker_url=os.environ["RELAY_BROKER_URL"],
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ["RELAY_QUEUE"],
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)


@outbox.register("topology.burst")
def log_delivery(message: OutboxMessage, dedup_key: str) -> None:
    line = f"{message.pk} {dedup_key} {os.getpid()}\n".encode()
    fd = os.open(os.environ["RELAY_DELIVERY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
