"""The admin of idempotency records: their condition, times and stored responses."""

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency import store
from django_idempotency.admin.actions import RecordActionsMixin
from django_idempotency.admin.display import (
    KEY_LIST_CHARS,
    VIEWER,
    admin_page,
    as_utc,
    body_text,
    lease_text,
    relative_text,
    store_now,
    stored_content_type,
    when_text,
)
from django_idempotency.models import IdempotencyRecord, OutboxMessage, RecordState
from django_idempotency.store import operators


class ConditionFilter(admin.SimpleListFilter):
    """Records by condition: in flight, abandoned, completed (``operators.CONDITIONS``)."""

    title = _("condition")
    parameter_name = "condition"
    _choices = {
        "in-flight": operators.IN_FLIGHT,
        "abandoned": operators.ABANDONED,
        "completed": operators.COMPLETED,
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The three conditions."""
        return [
            ("in-flight", str(_("in flight"))),
            ("abandoned", str(_("abandoned (the next retry takes over)"))),
            ("completed", str(_("completed"))),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The records in the chosen condition, judged by the store's clock."""
        condition = self._choices.get(str(self.value()))
        if condition is None:
            return queryset
        return operators.only_condition(queryset, condition)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(RecordActionsMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Operators browse and search records; nobody edits them by hand.

    Actions: "End the lease" of claimed records (the runbook's way to free a stuck
    key; needs the "change" permission) and "Forget the stored response" of
    completed records (needs "delete"), each behind a confirmation page. Deleting a
    record stays possible too.
    """

    list_display = ("short_key", "principal_link", "endpoint_and_path", "condition", "created")
    list_filter = (ConditionFilter, "endpoint", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=key", "principal", "=request_path")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("end_leases", "forget_responses")
    fields = (
        "principal_link",
        "endpoint",
        "path",
        "key",
        "condition",
        "fingerprint",
        "owner_token",
        "recovery_point",
        "created",
        "lease",
        "completed",
        "expires",
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
        if len(obj.key) <= KEY_LIST_CHARS:
            return obj.key
        return f"{obj.key[: KEY_LIST_CHARS - 1]}…"

    @admin.display(description=_("request path"), ordering="request_path")
    def path(self, obj: IdempotencyRecord) -> str:
        """The path the claiming request was sent to (the endpoint is its route).

        Empty for a record claimed without a request (``inbox.once``), shown as the
        admin's empty value.
        """
        return obj.request_path or self.get_empty_value_display()

    @admin.display(description=_("endpoint and path"), ordering="endpoint")
    def endpoint_and_path(self, obj: IdempotencyRecord) -> str:
        """The endpoint (method and route) with the concrete path under it, when kept."""
        if not obj.request_path:
            return obj.endpoint
        return format_html("{}<br><small>{}</small>", obj.endpoint, obj.request_path)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """The records, each with whether its owner is known to be gone (PostgreSQL)."""
        return operators.with_condition(super().get_queryset(request))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """The list, its times judged at one "now" of the store's clock."""
        with admin_page(request, self.get_queryset(request).db):
            response = super().changelist_view(request, extra_context)
            if hasattr(response, "render"):
                response.render()
        return response

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        """A record's page, its times judged at one "now" of the store's clock."""
        with admin_page(request, self.get_queryset(request).db):
            response = super().change_view(request, object_id, form_url, extra_context)
            if hasattr(response, "render"):
                response.render()
        return response

    @admin.display(description=_("principal"), ordering="principal")
    def principal_link(self, obj: IdempotencyRecord) -> str:
        """The principal; a link to the user's admin page when it names a user.

        A user principal is ``user_principal``'s ``"<app_label>.<model>:<pk>"`` for the
        user model; it links only when that model is registered on this admin site
        and the viewer may see it.
        """
        user_model = get_user_model()
        prefix = f"{user_model._meta.label_lower}:"
        request = VIEWER.get()
        if request is None or not obj.principal.startswith(prefix):
            return obj.principal
        user_admin = self.admin_site._registry.get(user_model)
        if user_admin is None or not user_admin.has_view_or_change_permission(request):
            return obj.principal
        opts = user_model._meta
        pk = obj.principal[len(prefix) :]
        try:
            url = reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
                args=[quote(pk)],
            )
        except NoReverseMatch:
            return obj.principal
        return format_html('<a href="{}">{}</a>', url, obj.principal)

    @admin.display(description=_("condition"), ordering="state")
    def condition(self, obj: IdempotencyRecord) -> str:
        """``in flight, lease ends in 42 s``, ``abandoned, ...``, ``completed 201, 2 h ago``.

        In flight: claimed, the lease live and the owner, where presence is known,
        present. Abandoned: claimed, the lease over or the owner's session gone; the
        next retry takes it over. A phased claim adds its last finished phase.
        """
        using = obj._state.db or "default"
        condition = operators.condition_of(obj, store_now(using))
        if condition == operators.COMPLETED:
            done = obj.completed_at or obj.created_at
            when = relative_text("{}", as_utc(done, using), using)
            return f"{gettext('completed')} {obj.response_status}, {when}"
        label = gettext("in flight") if condition == operators.IN_FLIGHT else gettext("abandoned")
        if getattr(obj, "owner_gone", False) and condition == operators.ABANDONED:
            detail = gettext("owner's session gone")
        else:
            detail = relative_text(lease_text(obj), as_utc(obj.lease_until, using), using)
        text = f"{label}, {detail}"
        if obj.recovery_point:
            text += ", " + gettext("after phase %(phase)s") % {"phase": obj.recovery_point}
        return text

    @admin.display(description=_("created at"), ordering="created_at")
    def created(self, obj: IdempotencyRecord) -> str:
        """When the key was claimed, to the second, and how long ago."""
        return when_text(obj.created_at, obj)

    @admin.display(description=_("lease until"))
    def lease(self, obj: IdempotencyRecord) -> str:
        """The lease's end, to the second: ``lease ends in 42 s`` / ``lease ended ...``."""
        return when_text(obj.lease_until, obj, lease_text(obj))

    @admin.display(description=_("completed at"))
    def completed(self, obj: IdempotencyRecord) -> str:
        """When the response was stored, to the second: ``completed 2 h ago``."""
        return when_text(obj.completed_at, obj, "completed {}")

    @admin.display(description=_("expires at"))
    def expires(self, obj: IdempotencyRecord) -> str:
        """The end of the retention window: ``expires in 23 h`` / ``expired 3 min ago``."""
        if obj.expires_at is None:
            return "-"
        using = obj._state.db or "default"
        future = as_utc(obj.expires_at, using) > store_now(using)
        return when_text(obj.expires_at, obj, "expires {}" if future else "expired {}")

    @admin.display(description=_("response headers"))
    def stored_headers(self, obj: IdempotencyRecord) -> str:
        """The stored headers, one per line."""
        lines = "\n".join(f"{name}: {value}" for name, value in obj.response_headers or ())
        return format_html("<pre>{}</pre>", lines or "-")

    @admin.display(description=_("response body"))
    def stored_body(self, obj: IdempotencyRecord) -> str:
        """The body exactly as a replay sends it, with its content type and size.

        ``BODY_CODEC`` undone; text shown as decoded (its charset, else UTF-8), never
        re-sorted or re-indented; any other body as its size and a download link.
        """
        if obj.response_body is None:
            if obj.state == RecordState.COMPLETED:
                return str(_("(not kept: larger than MAX_RESPONSE_BYTES)"))
            return "-"
        content_type = stored_content_type(obj)
        try:
            body = store.decode_body(obj.response_body)
        except Exception as exc:  # the codec's own errors (a removed key, corrupt data)
            return str(_("(cannot be decoded by BODY_CODEC: %(error)s)") % {"error": exc})
        size = ngettext("%(size)d byte", "%(size)d bytes", len(body)) % {"size": len(body)}
        about = f"{content_type or gettext('no Content-Type')}, {size}"
        url = reverse(
            f"{self.admin_site.name}:django_idempotency_idempotencyrecord_body", args=[obj.pk]
        )
        text = body_text(body, content_type)
        if text is None:
            return format_html(
                '<p>{}: <a href="{}">{}</a></p>', about, url, gettext("download the body")
            )
        return format_html(
            '<p>{} (<a href="{}">{}</a>)</p><pre>{}</pre>',
            about,
            url,
            gettext("download"),
            text,
        )

    def get_urls(self) -> list[Any]:
        """The admin's URLs and the stored body's download (``<id>/body/``)."""
        from django.urls import path

        body = path(
            "<path:object_id>/body/",
            self.admin_site.admin_view(self.body_view),
            name="django_idempotency_idempotencyrecord_body",
        )
        return [body, *super().get_urls()]

    def body_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The stored body's bytes as a replay sends them, as an attachment.

        With the stored ``Content-Type`` (``application/octet-stream`` if none), for a
        viewer who may see the record's page.

        Raises:
            PermissionDenied: the viewer may not see the record.
            Http404: no such record, or it stores no body.
            Exception: whatever ``BODY_CODEC`` raises for a body it cannot decode.
        """
        obj = self.get_object(request, unquote(object_id))
        if obj is None or obj.response_body is None:
            raise Http404("no stored body")
        if not self.has_view_or_change_permission(request, obj):
            raise PermissionDenied
        body = store.decode_body(obj.response_body)
        response = HttpResponse(
            body, content_type=stored_content_type(obj) or "application/octet-stream"
        )
        response["Content-Disposition"] = f'attachment; filename="idempotency-record-{obj.pk}-body"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    @admin.display(description=_("outbox messages"))
    def outbox(self, obj: IdempotencyRecord) -> str:
        """A link to the outbox messages this record's execution enqueued."""
        count = OutboxMessage.objects.using(obj._state.db).filter(record_id=obj.pk).count()
        if not count:
            return "-"
        url = reverse("admin:django_idempotency_outboxmessage_changelist")
        label = ngettext("%(count)d message", "%(count)d messages", count) % {"count": count}
        return format_html('<a href="{}?record__id__exact={}">{}</a>', url, obj.pk, label)
