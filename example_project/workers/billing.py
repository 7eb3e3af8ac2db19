"""A webhook receiver in the example itself: ``POST /hooks/billing`` (docs/inbox.md).

The outbox relay delivers each ``worker.provisioned`` notice here when
``LEASEBROKER_BILLING_URL`` names this endpoint (``workers/notifications.py``). The
sender does not log in: it signs the body (HMAC-SHA256 with
``LEASEBROKER_WEBHOOK_SECRET``, header ``X-Leasebroker-Signature``), and
``signed_principal`` gives signed deliveries the sender's principal. The key is the
event id in the body, the outbox dedup key: a relay that redelivers (killed between
delivering and marking the message sent) gets the stored answer, and the billing
event is recorded once.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_idempotency import idempotent
from django_idempotency.extractors import body_field
from django_idempotency.principals import hmac_signature, signed_principal

from .models import BillingEvent

SIGNATURE_HEADER = "X-Leasebroker-Signature"
#: The one sender of this endpoint; its keys are scoped to it.
SENDER = signed_principal(
    "webhook:leasebroker-outbox",
    hmac_signature(lambda: settings.LEASEBROKER_WEBHOOK_SECRET, SIGNATURE_HEADER),
)


@csrf_exempt
@require_POST
@idempotent(key=body_field("id"), principal=SENDER, endpoint="POST /hooks/billing")
def billing_webhook(request: HttpRequest) -> JsonResponse:
    """Record one billing event per event id; 201 with its id."""
    notice: dict[str, Any] = json.loads(request.body)
    event = BillingEvent.objects.create(event_id=notice["id"], worker_id=notice["worker"])
    return JsonResponse({"billing_event": event.pk, "event": notice["id"]}, status=201)
