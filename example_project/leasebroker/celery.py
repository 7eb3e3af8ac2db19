"""The leasebroker Celery app: the outbox relay and the retention sweeper on beat.

Run a worker with beat embedded (no broker server needed by default: kombu's filesystem
transport under ``example_project/var/broker``)::

    cd example_project && ../.venv/bin/celery -A leasebroker worker --beat --loglevel INFO

Point ``CELERY_BROKER_URL`` at Redis or RabbitMQ for a real deployment
(``redis://127.0.0.1:6379/0``, ``amqp://guest:guest@127.0.0.1:5672//``).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "leasebroker.settings")

app = Celery("leasebroker")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["django_idempotency"])
