"""Workers (fake virtual machines) and the leases that keep them allocated."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.utils import timezone

#: Crockford's base32: no I, L, O or U, so ids survive being read aloud or retyped.
ID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_worker_id() -> str:
    """A fresh worker id such as ``"wkr-7Q2K9"`` (32**5, about 33 million, values)."""
    return "wkr-" + "".join(secrets.choice(ID_ALPHABET) for _ in range(5))


class WorkerState(models.TextChoices):
    BOOTING = "booting"
    RUNNING = "running"
    REBOOTING = "rebooting"
    DELETED = "deleted"


class WorkerQuerySet(models.QuerySet):
    def live(self) -> WorkerQuerySet:
        """Workers that have not been deleted."""
        return self.exclude(state=WorkerState.DELETED)

    def allocate(self, *, owner: Any, **fields: Any) -> Worker:
        """Create a worker with a fresh random id (no lease yet: see ``Lease.grant``).

        Retries with another id on the (rare) collision; call inside a transaction.
        """
        for _attempt in range(10):
            try:
                with transaction.atomic():
                    return self.create(id=new_worker_id(), owner=owner, **fields)
            except IntegrityError:
                continue
        raise RuntimeError("could not find a free worker id")


class Worker(models.Model):
    id = models.CharField(primary_key=True, max_length=9, default=new_worker_id, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workers"
    )
    image = models.CharField(max_length=200)
    cpu = models.PositiveSmallIntegerField()
    memory_gb = models.PositiveSmallIntegerField()
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=16, choices=WorkerState.choices, default=WorkerState.BOOTING
    )
    reboots = models.PositiveIntegerField(default=0)
    # derive_key("worker") of the create request that allocated it: how a retry that
    # resumes after the "allocated" phase finds it again (docs/phases.md).
    request_ref = models.CharField(max_length=36, unique=True, null=True, editable=False)
    # The hypervisor's VM, once booted.
    vm_id = models.CharField(max_length=40, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["owner", "state"], name="worker_owner_state")]

    def __str__(self) -> str:
        return self.id


class LeaseQuerySet(models.QuerySet):
    def grant(self, worker: Worker, *, seconds: float) -> Lease:
        """A lease on ``worker`` for its owner, ending ``seconds`` from now."""
        return self.create(
            worker=worker,
            owner=worker.owner,
            expires_at=timezone.now() + dt.timedelta(seconds=seconds),
        )


class Lease(models.Model):
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="leases")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="leases"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    objects = LeaseQuerySet.as_manager()

    class Meta:
        ordering = ["-expires_at"]
        indexes = [models.Index(fields=["worker", "expires_at"], name="lease_worker_expires")]

    def __str__(self) -> str:
        return f"lease on {self.worker_id} until {self.expires_at:%Y-%m-%d %H:%M}"


class BillingEvent(models.Model):
    """A ``worker.provisioned`` notice as the billing receiver (``POST /hooks/billing``) took it.

    The receiver is protected by the event id the relay sends (the outbox dedup key),
    so a redelivered notice adds no second row; there is deliberately no unique
    constraint here to do that job instead.
    """

    event_id = models.CharField(max_length=255)
    worker_id = models.CharField(max_length=16)
    received_at = models.DateTimeField(default=timezone.now)
