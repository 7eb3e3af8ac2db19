"""DRF's browsable API on idempotent views: every rendered form carries its own key.

The browsable API's forms send no ``Idempotency-Key`` header, so a protected view
answers them 400 ``missing-key``. :class:`IdempotentBrowsableAPIRenderer` renders the
same page with one new idempotency key (a UUID) per render, given to the page's forms:

* the HTML form (a plain browser POST, ``multipart/form-data``) carries it in a hidden
  field, :data:`KEY_FIELD`; the app reads that field as the key only when the header is
  absent and the request negotiated this renderer (``request.accepted_renderer``), that
  is, when it asks for the browsable page;
* the forms the page submits with JavaScript (the raw data form, PUT, PATCH, DELETE)
  send it in the ``Idempotency-Key`` header (``browsable_api.js``).

Submitting one rendered form twice (a double click, the browser's resubmission on
reload) runs the view once and replays its response; a new render is a new operation.
A replayed page says so at its top (:meth:`IdempotentBrowsableAPIRenderer.idempotency_mark_replay`):
the reader sees that the view did not run again.
Nothing is exempt: a request without the header or the field is still a 400, and an
API client that asks for JSON is never read for the field. Usage (docs/usage.md)::

    REST_FRAMEWORK = {
        "DEFAULT_RENDERER_CLASSES": [
            "rest_framework.renderers.JSONRenderer",
            "django_idempotency.contrib.browsable.IdempotentBrowsableAPIRenderer",
        ],
    }
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from rest_framework.renderers import BrowsableAPIRenderer

#: The hidden form field that carries a rendered form's idempotency key.
KEY_FIELD = "_idempotency_key"

#: Where a page of this renderer shows that it is a replay: the top of its content
#: (``django_idempotency/browsable_api.html``). Replaced by the notice in a replay.
REPLAY_MARKER = b"<!-- django-idempotency: replay notice -->"

#: The forms of the page that a browser submits as HTML forms (the others are
#: submitted with JavaScript, which sends the key as the header).
_HTML_FORMS = ("post_form", "put_form")


class IdempotentBrowsableAPIRenderer(BrowsableAPIRenderer):
    """DRF's ``BrowsableAPIRenderer`` whose forms carry a new idempotency key per render.

    Put it in place of ``rest_framework.renderers.BrowsableAPIRenderer`` in
    ``DEFAULT_RENDERER_CLASSES`` or a view's ``renderer_classes``. Its template,
    ``django_idempotency/browsable_api.html``, extends DRF's ``rest_framework/api.html``
    (which a project may override as usual).
    """

    template = "django_idempotency/browsable_api.html"
    #: Read by the protocol (``keys.FORM_KEY_ATTRIBUTE``): the field that holds the key.
    idempotency_key_field = KEY_FIELD

    def get_context(
        self, data: Any, accepted_media_type: str | None, renderer_context: Mapping[str, Any]
    ) -> dict[str, Any]:
        """DRF's context, with ``idempotency_key`` and the key in each HTML form.

        Args:
            data: the response data, as DRF passes it.
            accepted_media_type: the negotiated media type.
            renderer_context: DRF's (``view``, ``request``, ``response``).

        Returns:
            The template context: DRF's, its HTML forms with a hidden :data:`KEY_FIELD`
            input, and ``idempotency_key``, the key of this render (a UUID string).
        """
        context: dict[str, Any] = super().get_context(data, accepted_media_type, renderer_context)
        key = str(uuid.uuid4())
        for name in _HTML_FORMS:
            form = context.get(name)
            if isinstance(form, str):
                context[name] = _with_key(form, key)
        context["idempotency_key"] = key
        context["idempotency_replay_marker"] = mark_safe(REPLAY_MARKER.decode())
        return context

    def idempotency_mark_replay(self, response: HttpResponseBase) -> HttpResponseBase:
        """A replay of a page this renderer rendered, with a notice that it is one.

        Called by the protocol (``handle.REPLAY_MARK_ATTRIBUTE``) for each replay answered
        to a request that negotiated this renderer. The stored page is sent as stored
        but for :data:`REPLAY_MARKER`, replaced by the notice; any other stored body (a
        JSON response of an API client's first request, a streamed one) is sent as is.

        Args:
            response: the replay, as the protocol built it (``Idempotent-Replayed``).

        Returns:
            ``response``, its body and ``Content-Length`` changed where it is such a page.
        """
        if not isinstance(response, HttpResponse):  # a streamed body is sent as stored
            return response
        body = response.content
        if REPLAY_MARKER not in body:
            return response
        notice = format_html(
            '<div class="alert alert-info" role="status" id="idempotency-replayed">'
            "<strong>{}</strong> {}</div>",
            gettext("Replayed."),
            gettext(
                "This request's idempotency key was used before: this page is the stored "
                "response of that first request (Idempotent-Replayed: true), and the view "
                "did not run again."
            ),
        )
        charset = response.charset or "utf-8"
        response.content = body.replace(REPLAY_MARKER, notice.encode(charset), 1)
        if response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
        return response


def _with_key(form: str, key: str) -> SafeString:
    hidden = format_html('<input type="hidden" name="{}" value="{}">', KEY_FIELD, key)
    return mark_safe(f"{form}{hidden}")
