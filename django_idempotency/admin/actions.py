"""The operators' actions on records: end the lease, forget the stored response (docs/admin.md)."""

from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency.admin.display import admin_page, lease_text, when_text
from django_idempotency.models import OutboxState, RecordState
from django_idempotency.store import operators


def left_alone(state: str, count: int) -> str:
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


def confirmed(request: HttpRequest) -> bool:
    """Whether ``request`` is the confirmation page's "Yes, I'm sure" (``post=yes``)."""
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
        """The confirmation page of ``action``: the records of ``queryset`` it changes.

        ``targets`` are those records (the others are counted, not listed); each is
        shown with the time the action is about (``when``: the lease's end, the
        completion), to the second in UTC with how long ago, as on the record pages.
        """
        with admin_page(request, targets.db):
            chosen = list(targets)
            for record in chosen:
                if action == "end_leases":
                    record.when = when_text(record.lease_until, record, lease_text(record))
                else:
                    record.when = when_text(record.completed_at, record, "completed {}")
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
        """Confirm, then end the live leases: the next retry takes each key over.

        The confirmation lists only the records whose lease is live (claimed, neither
        run out nor ended already); with none, it says so and offers no button.
        """
        targets = operators.with_live_lease(queryset)
        if not confirmed(request):
            return self._confirm(request, queryset, targets, "end_leases")
        selected = queryset.count()
        # Written on the router's write database (None) unless the queryset was pinned:
        # ``queryset.db`` would be the read database, perhaps a replica.
        count = operators.end_leases(
            list(queryset.values_list("pk", flat=True)), using=getattr(queryset, "_db", None)
        )
        if not count:  # they ran out, completed or were ended since the confirmation
            self.message_user(
                request,
                gettext("No lease was ended: none of the selected records has a live lease."),
                level="warning",
            )
            return None
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
        if not confirmed(request):
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
