"""Django admin: idempotency records and outbox messages, with operators' actions.

Records are read-only; operators end the lease of stuck claims and forget stored
responses (each action with a confirmation page). Outbox messages are read-only too;
operators retry, dead-letter or purge them in bulk. See docs/admin.md.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency import outbox, store
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState, RecordState
from django_idempotency.outbox import claim
from django_idempotency.store import operators
from django_idempotency.store.routing import outbox_database

#: Longest key shown in full in the record list (the detail page shows it all).
_KEY_LIST_CHARS = 40


def _pretty_body(body: bytes, content_type: str) -> str:
    text = body.decode("utf-8", errors="replace")
    if "json" in content_type:
        try:
            return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False)
        except ValueError:
            pass
    return text


def _left_alone(state: str, count: int) -> str:
    """Why ``count`` selected outbox messages in ``state`` were not retried."""
    if state == OutboxState.SENT:
        text = ngettext(
            "%(count)d selected message was left alone: it was sent already.",
            "%(count)d selected messages were left alone: they were sent already.",
            count,
        )
    else:
        text = ngettext(
            "%(count)d selected message was left alone: it is pending (the relay "
            "delivers it when due).",
            "%(count)d selected messages were left alone: they are pending (the relay "
            "delivers them when due).",
            count,
        )
    return text % {"count": count}


def _confirmed(request: HttpRequest) -> bool:
    return request.POST.get("post") == "yes"


class RecordActionsMixin:
    """``ModelAdmin`` actions for ``IdempotencyRecord``: ``end_leases``, ``forget_responses``.

    "End the lease" needs the model's "change" permission (the record form itself stays
    read-only); "Forget the stored response" needs "delete".
    """

    admin_site: Any
    opts: Any
    media: Any
    message_user: Any

    def has_end_lease_permission(self, request: HttpRequest) -> bool:
        """Ending leases needs the model's "change" permission (the form stays read-only)."""
        codename = get_permission_codename("change", self.opts)
        return bool(request.user.has_perm(f"{self.opts.app_label}.{codename}"))

    def _confirm(
        self, request: HttpRequest, queryset: QuerySet[Any], targets: QuerySet[Any], action: str
    ) -> TemplateResponse:
        """The confirmation page of ``action`` for the selected ``queryset``."""
        chosen = list(targets)
        titles = {
            "end_leases": _("End the lease"),
            "forget_responses": _("Forget the stored response"),
        }
        context = {
            **self.admin_site.each_context(request),
            "title": titles[action],
            "opts": self.opts,
            "queryset": queryset,
            "targets": chosen,
            "others": queryset.count() - len(chosen),
            "action": action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, f"admin/{self.opts.app_label}/{action}.html", context)

    @admin.action(
        description=_("End the lease of selected claimed records"), permissions=["end_lease"]
    )
    def end_leases(self, request: HttpRequest, queryset: QuerySet[Any]) -> TemplateResponse | None:
        """Confirm, then end the live leases: the next retry takes each key over."""
        targets = queryset.filter(state=RecordState.CLAIMED)
        if not _confirmed(request):
            return self._confirm(request, queryset, targets, "end_leases")
        selected = queryset.count()
        # Written on the router's write database (None) unless the queryset was pinned:
        # ``queryset.db`` would be the read database, perhaps a replica.
        count = operators.end_leases(
            list(queryset.values_list("pk", flat=True)), using=getattr(queryset, "_db", None)
        )
        self.message_user(
            request,
            ngettext(
                "%(count)d lease was ended: the next retry with its key takes it over.",
                "%(count)d leases were ended: the next retry with each key takes it over.",
                count,
            )
            % {"count": count},
        )
        self._report_skipped(request, selected - count)
        return None

    @admin.action(
        description=_("Forget the stored response of selected completed records"),
        permissions=["delete"],
    )
    def forget_responses(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> TemplateResponse | None:
        """Confirm, then delete the completed records: their keys run the view again."""
        targets = queryset.filter(state=RecordState.COMPLETED)
        if not _confirmed(request):
            return self._confirm(request, queryset, targets, "forget_responses")
        selected = queryset.count()
        count = operators.forget_responses(
            list(queryset.values_list("pk", flat=True)), using=getattr(queryset, "_db", None)
        )
        self.message_user(
            request,
            ngettext(
                "%(count)d stored response was forgotten: the next request with its key "
                "runs the view again.",
                "%(count)d stored responses were forgotten: the next request with each "
                "key runs the view again.",
                count,
            )
            % {"count": count},
        )
        self._report_skipped(request, selected - count)
        return None

    def _report_skipped(self, request: HttpRequest, skipped: int) -> None:
        if skipped > 0:
            self.message_user(
                request,
                ngettext(
                    "%(count)d selected record did not qualify and was left alone.",
                    "%(count)d selected records did not qualify and were left alone.",
                    skipped,
                )
                % {"count": skipped},
                level="warning",
            )


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(RecordActionsMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Operators browse and search records; nobody edits them by hand.

    Actions: "End the lease" of claimed records (the runbook's way to free a stuck
    key; needs the "change" permission) and "Forget the stored response" of
    completed records (needs "delete"), each behind a confirmation page. Deleting a
    record stays possible too.
    """

    list_display = ("short_key", "principal", "endpoint", "outcome", "created_at")
    list_filter = ("state", "endpoint", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=key", "principal")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("end_leases", "forget_responses")
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
        "outbox",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Records are created by the protocol only."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Records are never edited by hand (view-only)."""
        return False

    @admin.display(description=_("idempotency key"), ordering="key")
    def short_key(self, obj: IdempotencyRecord) -> str:
        """The key, shortened past 40 characters (the detail page shows it whole)."""
        if len(obj.key) <= _KEY_LIST_CHARS:
            return obj.key
        return f"{obj.key[: _KEY_LIST_CHARS - 1]}…"

    @admin.display(description=_("outcome"), ordering="state")
    def outcome(self, obj: IdempotencyRecord) -> str:
        """``completed 201``, or ``claimed`` with its recovery point."""
        if obj.state == RecordState.COMPLETED:
            return f"{obj.get_state_display()} {obj.response_status}"
        if obj.recovery_point:
            return str(_("claimed, after phase %(phase)s") % {"phase": obj.recovery_point})
        return str(obj.get_state_display())

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

    @admin.display(description=_("outbox messages"))
    def outbox(self, obj: IdempotencyRecord) -> str:
        """A link to the outbox messages this record's execution enqueued."""
        count = OutboxMessage.objects.using(obj._state.db).filter(record_id=obj.pk).count()
        if not count:
            return "-"
        url = reverse("admin:django_idempotency_outboxmessage_changelist")
        label = ngettext("%(count)d message", "%(count)d messages", count) % {"count": count}
        return format_html('<a href="{}?record__id__exact={}">{}</a>', url, obj.pk, label)


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Operators watch the outbox and retry, dead-letter or purge messages in bulk.

    Messages are never edited one by one: the detail page is read-only; the actions
    need the "change" permission.
    """

    list_display = ("id", "topic", "state", "attempts", "due", "created_at")
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
        "due",
        "created_at",
        "sent_at",
        "record_link",
        "error",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Messages are created by ``outbox.enqueue`` only."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Bulk actions need "change"; single messages are read-only."""
        return obj is None and super().has_change_permission(request)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """The list, titled as a view: messages are read-only, the actions work in bulk."""
        title = gettext("Select %s to view") % self.opts.verbose_name
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    @admin.display(description=_("available at"), ordering="available_at")
    def due(self, obj: OutboxMessage) -> Any:
        """When a pending or dead message is next due; "—" for a sent one (never again)."""
        if obj.state == OutboxState.SENT:
            return "—"
        return obj.available_at

    @admin.display(description=_("idempotency record"))
    def record_link(self, obj: OutboxMessage) -> str:
        """A link to the record of the request that enqueued the message, if it exists."""
        if obj.record_id is None:
            return "-"
        exists = IdempotencyRecord.objects.using(obj._state.db).filter(pk=obj.record_id).first()
        if exists is None:
            return str(_("#%(id)s (no longer exists: swept or forgotten)") % {"id": obj.record_id})
        try:
            url = reverse("admin:django_idempotency_idempotencyrecord_change", args=[obj.record_id])
        except NoReverseMatch:
            return str(exists)
        return format_html('<a href="{}">{}</a>', url, str(exists))

    @admin.display(description=_("last error"))
    def error(self, obj: OutboxMessage) -> str:
        """The last delivery error (a traceback), preformatted."""
        return format_html("<pre>{}</pre>", obj.last_error or "-")

    @admin.action(description=_("Retry selected dead messages"), permissions=["change"])
    def retry_dead(self, request: HttpRequest, queryset: Any) -> None:
        """Dead messages back to pending: attempts 0, due now; the relay is kicked.

        Selected messages that are not dead are left alone, and the message afterwards
        says how many of each state were (sent: delivered already; pending: the relay
        delivers them anyway).
        """
        # The UPDATE goes to the router's write database even when the changelist was
        # read from a replica; the relay kicked must work on that database too.
        using = queryset._db or outbox_database()
        left = dict(
            queryset.exclude(state=OutboxState.DEAD)
            .order_by()
            .values_list("state")
            .annotate(n=Count("pk"))
        )
        count = queryset.filter(state=OutboxState.DEAD).update(
            state=OutboxState.PENDING, attempts=0, available_at=claim.now(using)
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
        for state in (OutboxState.SENT, OutboxState.PENDING):
            if left.get(state):
                self.message_user(request, _left_alone(state, left[state]), level="warning")

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
