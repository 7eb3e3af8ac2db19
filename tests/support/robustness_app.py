"""Views and URLs for the hostile-input, database-fault and security tests.

Use with ``pytest.mark.urls("tests.support.robustness_app")``: the test app's URLs plus
views that accept any body and say who ran them, so a test can tell a replay from
an execution and one principal's response from another's.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view
from rest_framework.parsers import BaseParser, FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency import IdempotentMixin, idempotent
from tests.support.testapp.models import Widget
from tests.support.urls import urlpatterns as base_urlpatterns

#: A response header that is a secret (tests configure it as a replay header).
SECRET_HEADER_VALUE = "sk_live_response_secret_9f2c"


def tenant_principal(request: Any) -> str | None:
    """Principal resolver for the tests: the ``X-Tenant`` header, as sent."""
    return request.headers.get("X-Tenant") or None


def _tag(data: Any) -> Any:
    return data.get("tag") if isinstance(data, dict) else None


@api_view(["POST", "PUT", "PATCH", "DELETE"])
@idempotent
def echo(request: Any) -> Response:
    """DRF view accepting any parsed body: one Widget per execution."""
    data = request.data
    widget = Widget.objects.create(name=f"echo:{request.user.username}"[:100])
    return Response(
        {
            "principal": request.idempotency.principal,
            "user": request.user.username,
            "widget": widget.pk,
            "tag": _tag(data),
            "kind": type(data).__name__,
        },
        status=201,
    )


def _body_digest(request: HttpRequest) -> str:
    if (request.content_type or "").lower() == "multipart/form-data":
        fields = sorted((k, v) for k, vs in request.POST.lists() for v in vs)
        files = sorted((k, f.name or "") for k, fs in request.FILES.lists() for f in fs)
        return hashlib.sha256(repr((fields, files)).encode()).hexdigest()
    return hashlib.sha256(request.body).hexdigest()


@csrf_exempt
@idempotent
def raw(request: HttpRequest) -> HttpResponse:
    """Plain Django view, any method, any body: one Widget per execution."""
    context = request.idempotency  # type: ignore[attr-defined]
    principal = context.principal if context else "unprotected"
    widget = Widget.objects.create(name=f"raw:{principal}"[:100])
    return JsonResponse(
        {
            "principal": principal,
            "widget": widget.pk,
            "tag": request.GET.get("tag", ""),
            "method": request.method,
            "body_sha256": _body_digest(request),
        },
        status=201,
    )


@csrf_exempt
@idempotent
def sized(request: HttpRequest) -> HttpResponse:
    """Answers ``?n=`` bytes (streamed with ``?stream=1``); one Widget per execution."""
    size = int(request.GET.get("n", "0"))
    widget = Widget.objects.create(name="sized")
    body = (f"{widget.pk}:".encode() + b"x" * size)[: max(size, 1)]
    if request.GET.get("stream"):
        chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]
        response: HttpResponse = StreamingHttpResponse(iter(chunks), content_type="text/plain")
    else:
        response = HttpResponse(body, content_type="text/plain", status=201)
    response["Location"] = f"/widgets/{widget.pk}"
    response["ETag"] = f'"w{widget.pk}"'
    return response


@api_view(["POST"])
@idempotent
def secrets(request: Any) -> Response:
    """Answers with every kind of secret header and a cookie; creates a Widget."""
    widget = Widget.objects.create(name="secrets")
    response = Response({"widget": widget.pk}, status=201)
    response.set_cookie("sessionid", "cookie-secret-71d0")
    response["WWW-Authenticate"] = 'Bearer realm="secret-realm-5e1a"'
    response["Authorization"] = "Bearer authz-secret-33b7"
    response["Proxy-Authenticate"] = 'Basic realm="proxy-secret-0c4d"'
    response["X-Api-Secret"] = SECRET_HEADER_VALUE
    response["X-Widget-Version"] = "v7"
    return response


class PlainTextParser(BaseParser):
    """``text/plain`` bodies as ``str`` (a project's custom parser)."""

    media_type = "text/plain"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> str:
        return stream.read().decode()


class ReadsBodyFirst(BasePermission):
    """A permission that reads ``request.data``: DRF consumes the body before the claim."""

    def has_permission(self, request: Any, view: Any) -> bool:
        return request.data is not None


class PeekingView(IdempotentMixin, APIView):
    """An APIView whose permission parses the body before ``IdempotentMixin`` claims."""

    permission_classes = [IsAuthenticated, ReadsBodyFirst]
    parser_classes = [JSONParser, FormParser, MultiPartParser, PlainTextParser]

    def post(self, request: Any) -> Response:
        widget = Widget.objects.create(name="peek")
        data = request.data
        shown = data if isinstance(data, (str, list)) else dict(data.items())
        return Response({"widget": widget.pk, "data": shown}, status=201)


urlpatterns = [
    path("r/peek", PeekingView.as_view()),
    path("r/echo", echo),
    path("r/raw", raw),
    path("r/sized", sized),
    path("r/secrets", secrets),
    *base_urlpatterns,
]


class ToyCodec:
    """A reversible stand-in for encryption at rest (``BODY_CODEC``); not secure.

    It marks what it wrote (``toy1:``) and passes anything else through, the pattern a
    real codec needs to read rows stored before it was enabled (docs/security.md).
    """

    PREFIX = b"toy1:"

    def encode(self, data: bytes) -> bytes:
        return self.PREFIX + bytes(b ^ 0x5A for b in reversed(data))

    def decode(self, data: bytes) -> bytes:
        if not data.startswith(self.PREFIX):
            return data
        return bytes(b ^ 0x5A for b in reversed(data[len(self.PREFIX) :]))


TOY_CODEC = ToyCodec()
