"""Django admin: idempotency records and outbox messages, with operators' actions.

Records are read-only; operators end the lease of stuck claims and forget stored
responses (each action with a confirmation page). Outbox messages are read-only too;
operators retry, dead-letter or purge them in bulk. See docs/admin.md.
"""

from __future__ import annotations

from django_idempotency.admin.outbox import OutboxMessageAdmin
from django_idempotency.admin.records import IdempotencyRecordAdmin

__all__ = ["IdempotencyRecordAdmin", "OutboxMessageAdmin"]
