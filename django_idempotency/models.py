"""The idempotency record: one row per (principal, endpoint, key) (SPEC §3, §4)."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ._compat import check_constraint


class RecordState(models.TextChoices):
    """States of the record's state machine (SPEC §4).

    A released claim is deleted, so "released" is the absence of a row.
    """

    CLAIMED = "claimed", _("claimed")
    COMPLETED = "completed", _("completed")


class IdempotencyRecord(models.Model):
    """A claimed or completed idempotency key.

    Every write goes through ``django_idempotency.store``; the admin shows rows
    read-only. Times are in UTC; ``lease_until`` and ``expires_at`` follow the clock
    described in ``django_idempotency.clock``.
    """

    principal = models.CharField(_("principal"), max_length=255)
    endpoint = models.CharField(_("endpoint"), max_length=255)
    key = models.CharField(_("idempotency key"), max_length=255)
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    state = models.CharField(
        _("state"), max_length=16, choices=RecordState.choices, default=RecordState.CLAIMED
    )
    owner_token = models.UUIDField(_("owner token"), default=uuid.uuid4)
    lease_until = models.DateTimeField(_("lease until"))
    recovery_point = models.CharField(_("recovery point"), max_length=64, blank=True)
    response_status = models.PositiveSmallIntegerField(_("response status"), null=True)
    response_headers = models.JSONField(_("response headers"), default=list)
    response_body = models.BinaryField(_("response body"), null=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    completed_at = models.DateTimeField(_("completed at"), null=True)
    expires_at = models.DateTimeField(_("expires at"))

    class Meta:  # noqa: D106
        db_table = "django_idempotency_record"
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        constraints = [
            models.UniqueConstraint(
                fields=["principal", "endpoint", "key"],
                name="django_idempotency_record_scope_uniq",
            ),
            check_constraint(
                models.Q(state__in=RecordState.values),
                "django_idempotency_record_state_valid",
            ),
            check_constraint(
                models.Q(state=RecordState.CLAIMED) | models.Q(response_status__isnull=False),
                "django_idempotency_record_completed_has_response",
            ),
        ]
        indexes = [
            models.Index(fields=["expires_at"], name="django_idem_record_expires"),
            models.Index(fields=["created_at"], name="django_idem_record_created"),
        ]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.key} ({self.state})"
