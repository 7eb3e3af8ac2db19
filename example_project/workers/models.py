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

    def allocate(self, *, owner: Any, lease_seconds: float, **fields: Any) -> Worker:
        """Create a worker with a fresh random id and its first lease.

        Retries with another id on the (rare) collision; call inside a transaction.
        """
        for _attempt in range(10):
            try:
                with transaction.atomic():
                    worker = self.create(id=new_worker_id(), owner=owner, **fields)
            except IntegrityError:
                continue
            Lease.objects.create(
                worker=worker,
                owner=owner,
                expires_at=timezone.now() + dt.timedelta(seconds=lease_seconds),
            )
            return worker
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
    created_at = models.DateTimeField(default=timezone.now)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["owner", "state"], name="worker_owner_state")]

    def __str__(self) -> str:
        return self.id


class Lease(models.Model):
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="leases")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="leases"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-expires_at"]
        indexes = [models.Index(fields=["worker", "expires_at"], name="lease_worker_expires")]

    def __str__(self) -> str:
        return f"lease on {self.worker_id} until {self.expires_at:%Y-%m-%d %H:%M}"
