"""The idempotency record (docs/concepts.md) and the outbox message (docs/outbox.md)."""

from __future__ import annotations

import uuid
from typing import Any

import django
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


def check_constraint(condition: models.Q, name: str) -> models.CheckConstraint:
    """A ``CheckConstraint`` for the running Django (``check=`` before Django 5.1)."""
    keyword = "condition" if django.VERSION >= (5, 1) else "check"
    return models.CheckConstraint(name=name, **{keyword: condition})  # type: ignore[arg-type]


class RecordState(models.TextChoices):
    """States of the record's state machine (docs/concepts.md#the-state-machine).

    A released claim is deleted, so "released" is the absence of a row.
    """

    CLAIMED = "claimed", _("claimed")
    COMPLETED = "completed", _("completed")


class IdempotencyRecord(models.Model):
    """A claimed or completed idempotency key.

    Every write goes through ``django_idempotency.store``; the admin shows rows
    read-only. Times are in UTC; ``lease_until`` and ``expires_at`` follow the clock
    described in ``django_idempotency.store.clock``.

    ``expires_at`` is the end of the record's retention window: until then a retry
    replays (or waits for) it. It only ever moves later, and never ends before a live
    lease does: a takeover, a heartbeat or a late completion pushes it (docs/retention.md).
    ``sweep_after`` is the window's end as first claimed and never changes: on
    PostgreSQL it is the partition key, so each record is stored in the partition of
    the day its own window ends.
    ``request_path`` is the path the claiming request was sent to (``endpoint`` is its
    route), percent-encoded and cut to 255 characters, never its query string or body:
    for operators (the admin, ``idempotency_records``), not part of the scope; empty
    without a request (``inbox.once``), ``NULL`` for a row written by other SQL.
    ``owner_pid`` is the PostgreSQL backend process of the owner's session when that
    session holds the record's presence lock (docs/robustness.md#owner-presence);
    ``NULL`` when presence is unknown (a transaction pooler, another database, or the
    lock could not be taken), and then only the lease decides.
    """

    principal = models.CharField(_("principal"), max_length=255)
    endpoint = models.CharField(_("endpoint"), max_length=255)
    request_path = models.CharField(
        _("request path"), max_length=255, blank=True, null=True, default=""
    )
    key = models.CharField(_("idempotency key"), max_length=255)
    fingerprint = models.CharField(_("fingerprint"), max_length=160)
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
    sweep_after = models.DateTimeField(_("sweep after"), null=True)
    owner_pid = models.IntegerField(_("owner session"), null=True, editable=False)

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

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save; a record written outside the store gets ``sweep_after = expires_at``."""
        if self.sweep_after is None:
            self.sweep_after = self.expires_at
        super().save(*args, **kwargs)


class OutboxState(models.TextChoices):
    """States of an outbox message (docs/outbox.md).

    A message being delivered stays ``pending``: the relay leases it by moving its
    ``available_at`` into the future, so a relay that dies mid-delivery leaves it
    deliverable once that lease runs out.
    """

    PENDING = "pending", _("pending")
    SENT = "sent", _("sent")
    DEAD = "dead", _("dead")


class OutboxMessage(models.Model):
    """An effect outside the database, written in the view's transaction (docs/outbox.md).

    Rows are created by ``django_idempotency.outbox.enqueue`` and delivered by the relay
    (``outbox.relay``). ``attempts`` counts deliveries started, so a relay
    killed mid-delivery counts as an attempt. ``available_at`` is when the message is
    next due (while a relay holds it: when that relay's lease ends). Times follow the
    clock in ``django_idempotency.store.clock``.

    ``record`` links the idempotency record of the request that enqueued it. It has no
    database constraint (the record table may be partitioned and swept by dropping
    whole days), so after a sweep it may name a record that no longer exists.
    """

    topic = models.CharField(_("topic"), max_length=255)
    payload = models.JSONField(_("payload"), default=dict, encoder=DjangoJSONEncoder)
    dedup_key = models.CharField(_("dedup key"), max_length=255)
    state = models.CharField(
        _("state"), max_length=16, choices=OutboxState.choices, default=OutboxState.PENDING
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    available_at = models.DateTimeField(_("available at"), default=timezone.now)
    last_error = models.TextField(_("last error"), blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)
    record = models.ForeignKey(
        IdempotencyRecord,
        verbose_name=_("idempotency record"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        related_name="outbox_messages",
    )

    class Meta:  # noqa: D106
        db_table = "django_idempotency_outbox"
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "dedup_key"], name="django_idempotency_outbox_dedup_uniq"
            ),
            check_constraint(
                models.Q(state__in=OutboxState.values), "django_idempotency_outbox_state_valid"
            ),
        ]
        indexes = [
            # The relay's query: pending messages due now, oldest first.
            models.Index(
                fields=["available_at", "id"],
                condition=models.Q(state=OutboxState.PENDING),
                name="django_idem_outbox_due",
            ),
            models.Index(
                fields=["sent_at"],
                condition=models.Q(state=OutboxState.SENT),
                name="django_idem_outbox_sent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.topic} #{self.pk} ({self.state})"
