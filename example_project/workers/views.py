"""The workers API, protected by django-idempotency in its two styles.

* ``WorkerViewSet`` mixes in ``IdempotentMixin``: ``create``, ``destroy`` and
  ``reboot`` need an ``Idempotency-Key``; ``list`` and ``retrieve`` (GET) never do.
* ``renew_lease`` is a DRF function view decorated with ``@idempotent``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from django_idempotency import IdempotentMixin, idempotent, outbox

from . import hypervisor, notifications
from .models import Lease, Worker, WorkerState
from .serializers import WorkerSerializer

#: The phases of a create, in order. Never rename or reorder them while requests may
#: still resume (within PROVISIONING_RETENTION); new phases go at the end.
CREATE_PHASES = ["allocated", "leased", "booted"]

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
        # LEASEBROKER_CREATE_PHASES=false makes the create one transaction (the
        # benchmarks compare the bare protocol against the unprotected view with it).
        "create": {
            "retention": PROVISIONING_RETENTION,
            **({"phases": CREATE_PHASES} if settings.LEASEBROKER_CREATE_PHASES else {}),
        },
        "destroy": {},
        "reboot": {},
    }

    def get_queryset(self) -> QuerySet[Worker]:
        # Only the caller's own, live workers: anything else is a 404.
        return Worker.objects.live().filter(owner=self.request.user).select_related("owner")

    def perform_create(self, serializer: BaseSerializer) -> None:
        """allocate -> lease -> boot, each step an atomic phase (docs/phases.md).

        Each phase commits its writes with the record's recovery point. A retry after
        a crash resumes after the last phase that committed; the hypervisor gets a boot
        id derived from the key, so a boot that ran but did not commit converges on the
        same VM. The worker is found again by ``request_ref``, derived from the key.
        """
        idem = getattr(self.request, "idempotency", None)
        data: dict[str, Any] = dict(serializer.validated_data)
        if idem is None or not idem.phases:
            # No key and REQUIRED off (unprotected), or phases switched off: one
            # transaction (inside the protocol's own block when a key was sent).
            ref = idem.derive_key("worker") if idem else uuid.uuid4().hex
            with transaction.atomic():
                self._allocate(ref, data)
                self._lease(ref)
                self._boot(ref, boot_id=idem.derive_key("boot") if idem else ref)
        else:
            ref = idem.derive_key("worker")
            if idem.pending("allocated"):
                with idem.phase("allocated"):
                    self._allocate(ref, data)
            if idem.pending("leased"):
                with idem.phase("leased"):
                    self._lease(ref)
            if idem.pending("booted"):
                with idem.phase("booted"):
                    self._boot(ref, boot_id=idem.derive_key("boot"))
        serializer.instance = Worker.objects.select_related("owner").get(request_ref=ref)

    def _allocate(self, ref: str, data: dict[str, Any]) -> None:
        Worker.objects.allocate(
            owner=self.request.user, request_ref=ref, state=WorkerState.BOOTING, **data
        )

    def _lease(self, ref: str) -> None:
        worker = Worker.objects.select_for_update().get(request_ref=ref)
        Lease.objects.grant(worker, seconds=settings.LEASEBROKER_LEASE_SECONDS)

    def _boot(self, ref: str, *, boot_id: str) -> None:
        worker = Worker.objects.select_for_update().get(request_ref=ref)
        vm = hypervisor.client().boot(worker.id, boot_id=boot_id)  # outside our database
        worker.vm_id, worker.state = vm.vm_id, WorkerState.RUNNING
        worker.save(update_fields=["vm_id", "state"])
        # Delivered after this phase commits, by the relay (workers/notifications.py).
        outbox.enqueue(notifications.TOPIC, {"worker": worker.id, "vm_id": worker.vm_id})

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
