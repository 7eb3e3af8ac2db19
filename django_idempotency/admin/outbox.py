"""The admin of outbox messages: read-only, with retry, dead-letter and purge in bulk."""

from typing import Any

from django.contrib import admin
from django.db.models import Count
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency import outbox
from django_idempotency.admin.actions import left_alone
from django_idempotency.admin.display import admin_page, when_text
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState
from django_idempotency.store.outbox import outbox_store
from django_idempotency.store.routing import outbox_database


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Operators watch the outbox and retry, dead-letter or purge messages in bulk.

    Messages are never edited one by one: the detail page is read-only; the actions
    need the "change" permission.
    """

    list_display = ("id", "topic", "state", "attempts", "due", "created")
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
        "created",
        "sent",
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
        """The list, titled as a view: messages are read-only, the actions work in bulk.

        Its times are judged at one "now" of the store's clock.
        """
        title = gettext("Select %s to view") % self.opts.verbose_name
        with admin_page(request, self.get_queryset(request).db):
            response = super().changelist_view(request, {"title": title, **(extra_context or {})})
            if hasattr(response, "render"):
                response.render()
        return response

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        """A message's page, its times judged at one "now" of the store's clock."""
        with admin_page(request, self.get_queryset(request).db):
            response = super().change_view(request, object_id, form_url, extra_context)
            if hasattr(response, "render"):
                response.render()
        return response

    @admin.display(description=_("available at"), ordering="available_at")
    def due(self, obj: OutboxMessage) -> str:
        """When a pending or dead message is next due; "—" for a sent one (never again).

        To the second in UTC with how far it is: ``due in 30 s``, ``due 2 min ago``.
        """
        if obj.state == OutboxState.SENT:
            return "—"
        return when_text(obj.available_at, obj, "due {}")

    @admin.display(description=_("created at"), ordering="created_at")
    def created(self, obj: OutboxMessage) -> str:
        """When the message was enqueued, to the second in UTC, and how long ago."""
        return when_text(obj.created_at, obj)

    @admin.display(description=_("sent at"))
    def sent(self, obj: OutboxMessage) -> str:
        """When the message was delivered, to the second in UTC ("-" if not yet)."""
        return when_text(obj.sent_at, obj, "sent {}")

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
            state=OutboxState.PENDING, attempts=0, available_at=outbox_store(using).now()
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
                self.message_user(request, left_alone(state, left[state]), level="warning")

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
