"""Views whose responses carry many kinds of headers, for the replay tests.

Mounted with ``@pytest.mark.urls("tests.support.replay_app")``; the admin is mounted too.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

from django.contrib import admin
from django.http import HttpResponse
from django.urls import include, path
from django.utils import translation
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import IdempotentMixin, idempotent
from django_idempotency.protocol.drf import ReplayNegotiation
from tests.support.testapp.gates import GATES
from tests.support.testapp.models import Widget

#: Headers a first response carries that describe the response, and come back.
DESCRIBING = {
    "Content-Type": "text/csv; charset=utf-8",
    "Content-Disposition": 'attachment; filename="widgets.csv"',
    "Content-Language": "en",
    "Cache-Control": "private, no-store",
    "Last-Modified": "Tue, 01 Dec 2026 09:00:00 GMT",
    "Link": '</widgets.csv?page=2>; rel="next"',
    "X-Resource-Version": "17",
    "X-Export-Rows": "2",
}
#: Headers of the first exchange only, never replayed.
PER_EXCHANGE = {
    "Date": "Tue, 01 Dec 2026 09:00:00 GMT",
    "X-Request-Id": "req-b8e1",
    "X-Correlation-Id": "corr-77a0",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=t61rcWkgMzE",
    "WWW-Authenticate": 'Bearer realm="first-exchange"',
    "Proxy-Status": "edge; error=none",
    "Keep-Alive": "timeout=5",
    "Server-Timing": "db;dur=53",
    "Server": "first-box/1.0",
    "Access-Control-Allow-Origin": "https://first.example",
    "X-RateLimit-Remaining": "41",
}


def _gate(request: Any) -> None:
    name = request.headers.get("X-Gate")
    if name:
        GATES[name].pass_through()


@api_view(["POST"])
@idempotent
def export(request: Any) -> HttpResponse:
    """A CSV export (below ``@api_view``): an HttpResponse with every kind of header."""
    widget = Widget.objects.create(name="export")
    response = HttpResponse(f"id,name\n{widget.pk},export\n".encode(), status=201)
    for name, value in {**DESCRIBING, **PER_EXCHANGE}.items():
        response[name] = value
    response["ETag"] = f'"export-{widget.pk}"'
    response["Location"] = f"/exports/{widget.pk}"
    response.set_cookie("sessionid", "first-exchange-cookie")
    return response


@idempotent
@api_view(["POST"])
def gzipped(request: Any) -> HttpResponse:
    """A gzip-encoded JSON body (above ``@api_view``)."""
    widget = Widget.objects.create(name="gzip")
    body = gzip.compress(json.dumps({"id": widget.pk}).encode(), mtime=0)
    response = HttpResponse(body, content_type="application/json", status=201)
    response["Content-Encoding"] = "gzip"
    response["Vary"] = "Accept-Encoding"
    return response


class ReceiptView(IdempotentMixin, APIView):
    """A created receipt (the mixin): a DRF Response with the app's own headers."""

    def post(self, request: Any) -> Response:
        widget = Widget.objects.create(name=request.data.get("name", "receipt"))
        _gate(request)
        response = Response({"id": widget.pk, "name": widget.name}, status=201)
        response["Location"] = f"/receipts/{widget.pk}"
        response["ETag"] = f'"r{widget.pk}"'
        response["X-Resource-Version"] = "1"
        return response


class MethodView(APIView):
    """``@idempotent`` on an APIView method; replay-aware by ``content_negotiation_class``."""

    content_negotiation_class = ReplayNegotiation

    @idempotent
    def post(self, request: Any) -> Response:
        widget = Widget.objects.create(name="method")
        return Response({"id": widget.pk}, status=201)


@api_view(["POST"])
@idempotent
def own_problems(request: Any) -> HttpResponse:
    """Answers with the view's own problem+json (409 released, 422 stored)."""
    Widget.objects.create(name="own")
    status = int(request.data.get("status", 422))
    slug = {409: "name-taken", 422: "insufficient-funds"}[status]
    body = {"type": f"https://api.example.com/problems/{slug}", "title": slug, "status": status}
    return HttpResponse(json.dumps(body), status=status, content_type="application/problem+json")


@api_view(["POST"])
@idempotent
def localised(request: Any) -> Response:
    """A body in the request's language (Django's own German catalogue, for one)."""
    widget = Widget.objects.create(name="localised")
    message = translation.gettext("This field is required.")
    # Long enough for GZipMiddleware to compress it (200 bytes and more).
    return Response({"id": widget.pk, "message": message, "padding": "." * 240}, status=201)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("x/export", export),
    path("x/gzip", gzipped),
    path("x/receipt", ReceiptView.as_view()),
    path("x/method", MethodView.as_view()),
    path("x/own", own_problems),
    path("x/localised", localised),
    path("", include("tests.support.testapp.urls")),
]
