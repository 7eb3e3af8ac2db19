"""The tenant's idempotent views: an order written and its outbox message enqueued."""

from __future__ import annotations

import json
import threading
from typing import Any

from django.db import connection
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


class Gate:
    """Holds a view until the test lets it go: ``started`` when it runs, then ``release``."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def reset(self) -> None:
        self.started.clear()
        self.release.clear()


#: The gate of :func:`slow_order`.
SLOW = Gate()


#: The lease of :func:`slow_order`, seconds: a beat every 0.4 s.
SLOW_LEASE = 1.2


@idempotent(principal=principal, lease=SLOW_LEASE, heartbeat=True)
def slow_order(request: HttpRequest) -> Any:
    """Runs past its lease until the test releases it: the heartbeat keeps it."""
    SLOW.started.set()
    SLOW.release.wait(30)
    order = Order.objects.create(item="slow")
    return JsonResponse({"order": order.pk}, status=201)


@idempotent(principal=principal)
def extended_order(request: HttpRequest) -> Any:
    """Extends its own lease from inside its transaction (a second connection)."""
    inside = connection.in_atomic_block
    kept = request.idempotency.extend_lease(60)  # type: ignore[attr-defined]
    order = Order.objects.create(item="extended")
    return JsonResponse({"order": order.pk, "kept": kept, "inside": inside}, status=201)


@idempotent(principal=principal, wait=20)
def waited_order(request: HttpRequest) -> Any:
    """Duplicates wait for the first request (owner presence) instead of a 409."""
    order = Order.objects.create(item="waited")
    return JsonResponse({"order": order.pk}, status=201)


urlpatterns = [
    path("orders", create_order),
    path("slow-orders", slow_order),
    path("extended-orders", extended_order),
    path("waited-orders", waited_order),
]
