"""Effects outside the database, through the outbox: "worker provisioned" notices.

The create view enqueues a ``worker.provisioned`` message in the same transaction as
its last phase; the relay (the Celery task ``django_idempotency.relay_outbox``, or
``manage.py idempotency_relay``) delivers it after commit. This fake "billing
webhook" appends one JSON line per delivery to ``LEASEBROKER_NOTIFICATIONS`` and, like a
real receiver, ignores a dedup key it has already seen. With ``LEASEBROKER_BILLING_URL``
set, the notice goes over HTTP to the example's own receiver, ``POST /hooks/billing``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

from django_idempotency import outbox
from django_idempotency.principals import sign

TOPIC = "worker.provisioned"


def delivered() -> list[dict[str, Any]]:
    """Every notice the fake webhook accepted, oldest first."""
    path = Path(settings.LEASEBROKER_NOTIFICATIONS)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@outbox.register(TOPIC)
def send_provisioned(message: Any, dedup_key: str) -> None:
    """Deliver one notice, with the dedup key as its event id.

    With ``LEASEBROKER_BILLING_URL`` set: a signed POST to that receiver
    (``workers/billing.py``), which records each event id once; a failed POST raises,
    so the relay retries it. Without: the fake webhook file, which skips a dedup key it
    has already seen.
    """
    if settings.LEASEBROKER_BILLING_URL:
        post_notice(settings.LEASEBROKER_BILLING_URL, {"id": dedup_key, **message.payload})
        return
    if any(notice["dedup_key"] == dedup_key for notice in delivered()):
        return
    with open(settings.LEASEBROKER_NOTIFICATIONS, "a") as log:
        log.write(json.dumps({"dedup_key": dedup_key, **message.payload}) + "\n")


def post_notice(url: str, notice: dict[str, Any]) -> httpx.Response:
    """POST ``notice`` to the billing receiver, signed; raise unless it answered 2xx."""
    from .billing import SIGNATURE_HEADER

    body = json.dumps(notice).encode()
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(settings.LEASEBROKER_WEBHOOK_SECRET, body),
    }
    response = httpx.post(url, content=body, headers=headers, timeout=10)
    response.raise_for_status()
    return response
