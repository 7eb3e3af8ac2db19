"""The tenant's idempotent view: an order written and its outbox message enqueued."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path

from django_idempotency import idempotent, outbox
from tests.tenants.shop.models import Order


def principal(request: HttpRequest) -> str:
    """Every request runs as one principal: only the tenant tells two keys apart."""
    return "shop:customer"


@idempotent(principal=principal)
def create_order(request: HttpRequest) -> Any:
    body = json.loads(request.body or b"{}")
    order = Order.objects.create(item=body.get("item", ""))
    outbox.enqueue("order.created", {"order": order.pk})
    return JsonResponse({"order": order.pk}, status=201)


urlpatterns = [path("orders", create_order)]
