"""Django admin: idempotency records and outbox messages, with operators' actions.

Records are read-only; operators end the lease of stuck claims and forget stored
responses (each action with a confirmation page). Outbox messages are read-only too;
operators retry, dead-letter or purge them in bulk. See docs/admin.md.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency import outbox, store
from django_idempotency.models import IdempotencyRecord, OutboxMessage, OutboxState, RecordState
from django_idempotency.outbox import claim
from django_idempotency.store import clock, operators
from django_idempotency.store.routing import outbox_database

#: Longest key shown in full in the record list (the detail page shows it all).
_KEY_LIST_CHARS = 40

#: Now by the store's clock, read once per admin page (``_page``).
_now: ContextVar[dt.datetime | None] = ContextVar("django_idempotency_admin_now", default=None)
#: The request of the admin page being rendered (``_page``): who is looking.
_viewer: ContextVar[HttpRequest | None] = ContextVar(
    "django_idempotency_admin_viewer", default=None
)


@contextmanager
def _page(request: HttpRequest, using: str) -> Iterator[None]:
    """Inside the block, one "now" of the store's clock and the viewer, for the page.

    The page's times are judged at that "now"; its links follow the viewer's
    permissions.
    """
    now_token = _now.set(clock.store_now(connections[using]))
    viewer_token = _viewer.set(request)
    try:
        yield
    finally:
        _viewer.reset(viewer_token)
        _now.reset(now_token)


def _store_now(using: str) -> dt.datetime:
    """The page's "now" (``_store_clock``), else read from the store's clock."""
    return _now.get() or clock.store_now(connections[using])


def _utc(value: dt.datetime, using: str) -> dt.datetime:
    return clock.from_db(value, connections[using])


def _when(value: dt.datetime | None, obj: Any, text: str = "{}") -> str:
    """``value`` to the second in UTC, with ``text`` about how far it is from now.

    ``text`` holds ``{}`` where the relative time goes ("lease ends {}").
    """
    if value is None:
        return "-"
    using = obj._state.db or "default"
    moment = _utc(value, using)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({_relative_text(text, moment, using)})"


def _relative_text(text: str, moment: dt.datetime, using: str) -> str:
    return text.format(operators.relative(moment, _store_now(using)))


def _lease_text(obj: Any) -> str:
    """``lease ends in 42 s`` / ``lease ended 3 min ago`` (``by an operator`` when so)."""
    using = obj._state.db or "default"
    moment = _utc(obj.lease_until, using)
    if moment > _store_now(using):
        return "lease ends {}"
    if obj.lease_until == obj.created_at:
        return "lease ended by an operator {}"
    return "lease ended {}"


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


#: Media types shown as text besides ``text/*`` (and ``+json``, ``+xml`` suffixes).
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/problem+json",
        "application/xml",
        "application/javascript",
        "application/x-www-form-urlencoded",
        "application/x-ndjson",
        "application/yaml",
    }
)


def _content_type(obj: IdempotencyRecord) -> str:
    """The stored ``Content-Type`` header ("" if none was stored)."""
    return next((v for n, v in obj.response_headers or () if n.lower() == "content-type"), "")


def body_text(body: bytes, content_type: str) -> str | None:
    """``body`` as the text a client reads from it; ``None`` if it is not text.

    Text is a ``text/*``, JSON, XML or form media type (the ``charset`` parameter, else
    UTF-8) whose bytes decode without error in that charset; the text is the bytes
    decoded, nothing re-sorted or re-indented. An empty ``content_type`` counts as text
    when the bytes are UTF-8.

    Args:
        body: the body exactly as a replay sends it (``store.decode_body``).
        content_type: the stored ``Content-Type`` header value.
    """
    media, *params = (part.strip() for part in content_type.split(";"))
    media = media.lower()
    textual = (
        not media
        or media.startswith("text/")
        or media in _TEXT_TYPES
        or media.endswith(("+json", "+xml"))
    )
    if not textual:
        return None
    charset = "utf-8"
    for param in params:
        name, _sep, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip('"')
    try:
        return body.decode(charset)
    except (LookupError, UnicodeDecodeError):
        return None


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

    list_display = ("short_key", "principal_link", "endpoint", "condition", "created")
    list_filter = (ConditionFilter, "endpoint", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=key", "principal")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("end_leases", "forget_responses")
    fields = (
        "principal_link",
        "endpoint",
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
        if len(obj.key) <= _KEY_LIST_CHARS:
            return obj.key
        return f"{obj.key[: _KEY_LIST_CHARS - 1]}…"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """The records, each with whether its owner is known to be gone (PostgreSQL)."""
        return operators.with_condition(super().get_queryset(request))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """The list, its times judged at one "now" of the store's clock."""
        with _page(request, self.get_queryset(request).db):
            response = super().changelist_view(request, extra_context)
            if hasattr(response, "render"):
                response.render()
        return response

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        """A record's page, its times judged at one "now" of the store's clock."""
        with _page(request, self.get_queryset(request).db):
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
        request = _viewer.get()
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
        condition = operators.condition_of(obj, _store_now(using))
        if condition == operators.COMPLETED:
            done = obj.completed_at or obj.created_at
            when = _relative_text("{}", _utc(done, using), using)
            return f"{gettext('completed')} {obj.response_status}, {when}"
        label = gettext("in flight") if condition == operators.IN_FLIGHT else gettext("abandoned")
        if getattr(obj, "owner_gone", False) and condition == operators.ABANDONED:
            detail = gettext("owner's session gone")
        else:
            detail = _relative_text(_lease_text(obj), _utc(obj.lease_until, using), using)
        text = f"{label}, {detail}"
        if obj.recovery_point:
            text += ", " + gettext("after phase %(phase)s") % {"phase": obj.recovery_point}
        return text

    @admin.display(description=_("created at"), ordering="created_at")
    def created(self, obj: IdempotencyRecord) -> str:
        """When the key was claimed, to the second, and how long ago."""
        return _when(obj.created_at, obj)

    @admin.display(description=_("lease until"))
    def lease(self, obj: IdempotencyRecord) -> str:
        """The lease's end, to the second: ``lease ends in 42 s`` / ``lease ended ...``."""
        return _when(obj.lease_until, obj, _lease_text(obj))

    @admin.display(description=_("completed at"))
    def completed(self, obj: IdempotencyRecord) -> str:
        """When the response was stored, to the second: ``completed 2 h ago``."""
        return _when(obj.completed_at, obj, "completed {}")

    @admin.display(description=_("expires at"))
    def expires(self, obj: IdempotencyRecord) -> str:
        """The end of the retention window: ``expires in 23 h`` / ``expired 3 min ago``."""
        if obj.expires_at is None:
            return "-"
        using = obj._state.db or "default"
        future = _utc(obj.expires_at, using) > _store_now(using)
        return _when(obj.expires_at, obj, "expires {}" if future else "expired {}")

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
        content_type = _content_type(obj)
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
        response = HttpResponse(body, content_type=_content_type(obj) or "application/octet-stream")
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
