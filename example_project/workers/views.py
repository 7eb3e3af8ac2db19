"""The workers API, protected by django-idempotency in its two styles.

* ``WorkerViewSet`` mixes in ``IdempotentMixin``: ``create``, ``destroy`` and
  ``reboot`` need an ``Idempotency-Key``; ``list`` and ``retrieve`` (GET) never do.
* ``renew_lease`` is a DRF function view decorated with ``@idempotent``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from django_idempotency import IdempotentMixin, idempotent

from . import hypervisor
from .models import Lease, Worker, WorkerState
from .serializers import WorkerSerializer

#: Provisioning keys are kept for 7 days: a client retrying a create days later
#: (after an outage, from a queue) still gets its original worker, not a second one.
PROVISIONING_RETENTION = 7 * 24 * 60 * 60


class WorkerViewSet(
    IdempotentMixin,
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """``/v1/workers``: allocate, list, show, reboot and delete your workers."""

    serializer_class = WorkerSerializer
    lookup_value_converter = "str"
    idempotent_actions = {
        "create": {"retention": PROVISIONING_RETENTION},
        "destroy": {},
        "reboot": {},
    }

    def get_queryset(self) -> QuerySet[Worker]:
        # Only the caller's own, live workers: anything else is a 404.
        return Worker.objects.live().filter(owner=self.request.user).select_related("owner")

    def perform_create(self, serializer: BaseSerializer) -> None:
        data: dict[str, Any] = dict(serializer.validated_data)
        worker = Worker.objects.allocate(
            owner=self.request.user,
            lease_seconds=settings.LEASEBROKER_LEASE_SECONDS,
            state=WorkerState.BOOTING,
            **data,
        )
        worker.state = hypervisor.boot(worker.id)
        worker.save(update_fields=["state"])
        serializer.instance = worker

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().create(request, *args, **kwargs)
        worker_id = response.data["id"]
        response["Location"] = f"/v1/workers/{worker_id}"
        response["X-Worker-Id"] = worker_id
        return response

    def perform_destroy(self, instance: Worker) -> None:
        # Soft delete: the worker disappears from the API, its history stays.
        instance.state = WorkerState.DELETED
        instance.save(update_fields=["state"])
        instance.leases.all().delete()

    @action(detail=True, methods=["post"])
    def reboot(self, request: Request, pk: str | None = None) -> Response:
        """Reboot the worker: slow, and it must happen once per key."""
        worker = self.get_object()
        hypervisor.reboot(worker.id)  # slow, and before any database write
        worker.state = WorkerState.RUNNING
        worker.reboots += 1
        worker.save(update_fields=["state", "reboots"])
        return Response(self.get_serializer(worker).data)


@idempotent  # above @api_view: also exempts the view from ATOMIC_REQUESTS
@api_view(["POST"])
def renew_lease(request: Request, pk: str) -> Response:
    """``POST /v1/workers/<id>/renew``: push the worker's lease one period further.

    Not idempotent by nature (each call adds a period), which is why it needs a key:
    a retried renewal must not add a second period.
    """
    worker = get_object_or_404(Worker.objects.live(), pk=pk, owner=request.user)
    lease = worker.leases.order_by("-expires_at").first()
    period = dt.timedelta(seconds=settings.LEASEBROKER_LEASE_SECONDS)
    start = max(timezone.now(), lease.expires_at) if lease else timezone.now()
    Lease.objects.create(worker=worker, owner=request.user, expires_at=start + period)
    return Response(WorkerSerializer(worker).data, status=status.HTTP_200_OK)
