"""Django admin: idempotency records (read-only) and outbox messages (bulk actions)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import outbox, relay, store
from .models import IdempotencyRecord, OutboxMessage, OutboxState, RecordState


def _pretty_body(body: bytes, content_type: str) -> str:
    text = body.decode("utf-8", errors="replace")
    if "json" in content_type:
        try:
            return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False)
        except ValueError:
            pass
    return text


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Operators browse and search records; nobody edits them by hand.

    Deleting a record is allowed: it releases a stuck key (the next request with it
    runs again), which is sometimes what an operator needs.
    """

    list_display = (
        "key",
        "principal",
        "endpoint",
        "state",
        "response_status",
        "created_at",
        "lease_until",
        "expires_at",
    )
    list_filter = ("state", "endpoint", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=key", "principal")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False
    fields = (
        "principal",
        "endpoint",
        "key",
        "state",
        "fingerprint",
        "owner_token",
        "recovery_point",
        "created_at",
        "lease_until",
        "completed_at",
        "expires_at",
        "response_status",
        "stored_headers",
        "stored_body",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Records are created by the protocol only."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Records are never edited by hand (view-only)."""
        return False

    @admin.display(description=_("response headers"))
    def stored_headers(self, obj: IdempotencyRecord) -> str:
        """The stored headers, one per line."""
        lines = "\n".join(f"{name}: {value}" for name, value in obj.response_headers or ())
        return format_html("<pre>{}</pre>", lines or "-")

    @admin.display(description=_("response body"))
    def stored_body(self, obj: IdempotencyRecord) -> str:
        """The stored body (``BODY_CODEC`` undone), as UTF-8, pretty-printed if JSON."""
        if obj.response_body is None:
            if obj.state == RecordState.COMPLETED:
                return str(_("(not kept: larger than MAX_RESPONSE_BYTES)"))
            return "-"
        content_type = next(
            (v for n, v in obj.response_headers or () if n.lower() == "content-type"), ""
        )
        body = store.decode_body(obj.response_body)
        return format_html("<pre>{}</pre>", _pretty_body(body, content_type))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Operators watch the outbox and retry, dead-letter or purge messages in bulk.

    Messages are never edited one by one: the detail page is read-only; the actions
    need the "change" permission.
    """

    list_display = (
        "id",
        "topic",
        "state",
        "attempts",
        "available_at",
        "created_at",
        "sent_at",
        "dedup_key",
    )
    list_filter = ("state", "topic")
    search_fields = ("=dedup_key", "=topic")
    ordering = ("-id",)
    show_full_result_count = False
    actions = ("retry_dead", "dead_letter", "purge_sent")
    fields = (
        "topic",
        "state",
        "dedup_key",
        "payload",
        "attempts",
        "available_at",
        "created_at",
        "sent_at",
        "record_id",
        "error",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Messages are created by ``outbox.enqueue`` only."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Bulk actions need "change"; single messages are read-only."""
        return obj is None and super().has_change_permission(request)

    @admin.display(description=_("last error"))
    def error(self, obj: OutboxMessage) -> str:
        """The last delivery error (a traceback), preformatted."""
        return format_html("<pre>{}</pre>", obj.last_error or "-")

    @admin.action(description=_("Retry selected dead messages"), permissions=["change"])
    def retry_dead(self, request: HttpRequest, queryset: Any) -> None:
        """Dead messages back to pending: attempts 0, due now; the relay is kicked."""
        # The UPDATE goes to the router's write database even when the changelist was
        # read from a replica; the relay kicked must work on that database too.
        using = queryset._db or outbox.database_for_write()
        count = queryset.filter(state=OutboxState.DEAD).update(
            state=OutboxState.PENDING, attempts=0, available_at=relay.now(using)
        )
        if count:
            outbox.kick(using)
        self.message_user(
            request,
            ngettext(
                "%(count)d dead message will be retried.",
                "%(count)d dead messages will be retried.",
                count,
            )
            % {"count": count},
        )

    @admin.action(description=_("Dead-letter selected pending messages"), permissions=["change"])
    def dead_letter(self, request: HttpRequest, queryset: Any) -> None:
        """Stop retrying pending messages: state dead (retry them later if needed)."""
        count = queryset.filter(state=OutboxState.PENDING).update(state=OutboxState.DEAD)
        self.message_user(
            request,
            ngettext(
                "%(count)d pending message was dead-lettered.",
                "%(count)d pending messages were dead-lettered.",
                count,
            )
            % {"count": count},
        )

    @admin.action(description=_("Purge selected sent messages"), permissions=["delete"])
    def purge_sent(self, request: HttpRequest, queryset: Any) -> None:
        """Delete the selected messages that were sent (others are kept)."""
        count, _deleted = queryset.filter(state=OutboxState.SENT).delete()
        self.message_user(
            request,
            ngettext(
                "%(count)d sent message was purged.",
                "%(count)d sent messages were purged.",
                count,
            )
            % {"count": count},
        )
