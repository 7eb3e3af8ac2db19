"""``manage.py billing_status``: the outbox's notices and the billing events, as JSON.

For the demo: every ``worker.provisioned`` message (state, attempts, dedup key) and how
many billing events the receiver recorded for each dedup key.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count

from django_idempotency.models import OutboxMessage
from workers.models import BillingEvent
from workers.notifications import TOPIC


class Command(BaseCommand):
    help = "Print the worker.provisioned messages and billing events as JSON."

    def handle(self, *args: Any, **options: Any) -> None:
        events = dict(
            BillingEvent.objects.values("event_id")
            .annotate(n=Count("id"))
            .values_list("event_id", "n")
        )
        messages = [
            {"dedup_key": m.dedup_key, "state": m.state, "attempts": m.attempts,
             "billing_events": events.get(m.dedup_key, 0)}
            for m in OutboxMessage.objects.filter(topic=TOPIC).order_by("id")
        ]  # fmt: skip
        self.stdout.write(json.dumps(messages))
