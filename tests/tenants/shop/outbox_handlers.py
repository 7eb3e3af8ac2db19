"""The outbox handler of the tenant suite: records each delivery in the current schema."""

from __future__ import annotations

from typing import Any

from django_idempotency import outbox
from tests.tenants.shop.models import Delivery


@outbox.handler("order.created")
def order_created(message: Any, dedup_key: str) -> None:
    Delivery.objects.create(order=message.payload["order"], dedup_key=dedup_key)
