"""Django admin for idempotency records: searchable, filterable, read-only."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from .models import IdempotencyRecord


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
        """The stored body, decoded as UTF-8 and pretty-printed when it is JSON."""
        if obj.response_body is None:
            return "-"
        content_type = next(
            (v for n, v in obj.response_headers or () if n.lower() == "content-type"), ""
        )
        return format_html("<pre>{}</pre>", _pretty_body(bytes(obj.response_body), content_type))
