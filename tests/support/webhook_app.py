"""Webhook receivers for tests/inbox/test_receivers.py: keys from elsewhere in the request.

Mounted with ``@pytest.mark.urls("tests.support.webhook_app")``. The senders are signed, not
logged in: each receiver's principal comes from ``signed_principal``.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.response import Response

from django_idempotency import idempotent
from django_idempotency.extractors import body_field, combined, header
from django_idempotency.principals import hmac_signature, signed_principal
from tests.support.testapp.gates import GATES
from tests.support.testapp.models import Widget

SECRET = "whsec-tests-only"
GITHUB = signed_principal("webhook:github", hmac_signature(SECRET, "X-Hub-Signature-256"))
STRIPE = signed_principal("webhook:stripe", hmac_signature(SECRET, "X-Test-Signature"))
#: The secret read from a setting on every request, as docs/inbox.md shows it.
ROTATED = signed_principal(
    "webhook:rotated",
    hmac_signature(lambda: getattr(settings, "WEBHOOK_SECRET", SECRET), "X-Test-Signature"),
)


def _stripe_event(request: Any) -> JsonResponse:
    event = json.loads(request.body)
    widget = Widget.objects.create(name=event["id"], size=event["data"]["amount"])
    return JsonResponse({"received": event["id"], "widget": widget.pk}, status=201)


@csrf_exempt
@idempotent(key=body_field("id"), principal=STRIPE)
def stripe_receiver(request: Any) -> JsonResponse:
    return _stripe_event(request)


@csrf_exempt
@idempotent(key=header("X-GitHub-Delivery"), principal=GITHUB)
def github_receiver(request: Any) -> JsonResponse:
    widget = Widget.objects.create(name=request.headers["X-GitHub-Delivery"])
    return JsonResponse({"widget": widget.pk}, status=202)


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
@idempotent(key=body_field("data.event_id"), principal=STRIPE)
def drf_receiver(request: Any) -> Response:
    widget = Widget.objects.create(name=request.data["data"]["event_id"])
    return Response({"widget": widget.pk}, status=201)


@csrf_exempt
@idempotent(key=combined(header("X-Source"), body_field("id")), principal=STRIPE)
def combined_receiver(request: Any) -> JsonResponse:
    return _stripe_event(request)


@csrf_exempt
@idempotent(key=body_field("id"), principal=STRIPE)
def slow_receiver(request: Any) -> JsonResponse:
    gate = request.headers.get("X-Gate")
    if gate:
        GATES[gate].pass_through()
    return _stripe_event(request)


@csrf_exempt
@idempotent(key=body_field("id"), principal=ROTATED)
def rotated_receiver(request: Any) -> JsonResponse:
    return _stripe_event(request)


def sdk_verify(request: Any) -> bool:
    """A sender SDK's check: a bare ``callable(request) -> bool``, with no reasons."""
    return request.headers.get("X-Sdk-Signature") == "valid"


SDK = signed_principal("webhook:sdk", sdk_verify)


@csrf_exempt
@idempotent(key=body_field("id"), principal=SDK)
def sdk_receiver(request: Any) -> JsonResponse:
    return _stripe_event(request)


def no_key(request: Any) -> str | None:
    return None


@csrf_exempt
@idempotent(key=no_key, required=False, principal=STRIPE)
def optional_receiver(request: Any) -> JsonResponse:
    return _stripe_event(request)


def broken_extractor(request: Any) -> str:
    return json.loads(request.body)["missing"]  # KeyError on most bodies


@csrf_exempt
@idempotent(key="tests.support.webhook_app.broken_extractor", principal=STRIPE)
def dotted_receiver(request: Any) -> JsonResponse:
    return _stripe_event(request)


urlpatterns = [
    path("hooks/stripe", stripe_receiver),
    path("hooks/github", github_receiver),
    path("hooks/drf", drf_receiver),
    path("hooks/combined", combined_receiver),
    path("hooks/optional", optional_receiver),
    path("hooks/dotted", dotted_receiver),
    path("hooks/slow", slow_receiver),
    path("hooks/rotated", rotated_receiver),
    path("hooks/sdk", sdk_receiver),
]
