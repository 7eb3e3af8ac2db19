"""Effects outside the database, through the outbox: "worker provisioned" notices.

The create view enqueues a ``worker.provisioned`` message in the same transaction as
its last phase; the relay (the Celery task ``django_idempotency.relay_outbox``, or
``manage.py idempotency_relay``) delivers it after commit. This fake "billing
webhook" appends one JSON line per delivery to ``LEASEBROKER_NOTIFICATIONS`` and, like a
real receiver, ignores a dedup key it has already seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings

from django_idempotency import outbox

TOPIC = "worker.provisioned"


def delivered() -> list[dict[str, Any]]:
    """Every notice the fake webhook accepted, oldest first."""
    path = Path(settings.LEASEBROKER_NOTIFICATIONS)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@outbox.register(TOPIC)
def send_provisioned(message: Any, dedup_key: str) -> None:
    """Deliver one notice; a redelivery with a known dedup key changes nothing."""
    if any(notice["dedup_key"] == dedup_key for notice in delivered()):
        return
    with open(settings.LEASEBROKER_NOTIFICATIONS, "a") as log:
        log.write(json.dumps({"dedup_key": dedup_key, **message.payload}) + "\n")
