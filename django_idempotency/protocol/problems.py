"""RFC 9457 ``application/problem+json`` responses for every error this app produces.

Each problem has a stable slug; its ``type`` URI is ``PROBLEM_TYPE_BASE + slug`` and
every slug is documented in ``docs/problems.md``. No problem ever carries a stack
trace or the idempotency key itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse

from django_idempotency.conf import conf

CONTENT_TYPE = "application/problem+json"


@dataclass(frozen=True)
class ProblemType:
    """One kind of problem: ``slug`` (URI suffix), HTTP ``status`` and ``title``."""

    slug: str
    status: int
    title: str


MISSING_KEY = ProblemType("missing-key", 400, "Idempotency-Key header required")
INVALID_KEY = ProblemType("invalid-key", 400, "Invalid Idempotency-Key header")
#: The same problems for a key a view's ``key=`` extractor takes from the request (a
#: webhook's event id, docs/inbox.md): same slugs, titles that name no header.
MISSING_EXTRACTED_KEY = ProblemType("missing-key", 400, "Idempotency key required")
INVALID_EXTRACTED_KEY = ProblemType("invalid-key", 400, "Invalid idempotency key")
UNREADABLE_BODY = ProblemType("unreadable-body", 400, "Request body could not be read")
BODY_TOO_LARGE = ProblemType("body-too-large", 413, "Request body too large")
NO_PRINCIPAL = ProblemType("no-principal", 401, "Authentication required for idempotent requests")
#: The same problem where no authentication scheme can be challenged (RFC 9110
#: §15.5.2 requires ``WWW-Authenticate`` with a 401), as DRF answers 403 then.
NO_PRINCIPAL_FORBIDDEN = ProblemType(
    "no-principal", 403, "Authentication required for idempotent requests"
)
#: A signed sender's request whose signature is missing, malformed or wrong (docs/inbox.md).
INVALID_SIGNATURE = ProblemType("invalid-signature", 403, "Request signature refused")
KEY_REUSED = ProblemType("key-reused", 422, "Idempotency-Key reused with a different request")
#: The same problem for a key taken from elsewhere in the request: a title with no header.
KEY_REUSED_EXTRACTED = ProblemType(
    "key-reused", 422, "Idempotency key reused with a different request"
)
IN_FLIGHT = ProblemType(
    "request-in-flight", 409, "A request with this Idempotency-Key is in progress"
)
LEASE_LOST = ProblemType("lease-lost", 409, "This request lost its claim on the Idempotency-Key")
STORE_UNAVAILABLE = ProblemType("store-unavailable", 503, "Idempotency store unavailable")
#: The request runs where the store has no tables (django-tenants' public schema with
#: the app in ``TENANT_APPS`` only): a server misconfiguration, not worth a retry.
STORE_NOT_SET_UP = ProblemType(
    "store-not-set-up", 500, "Idempotency store not set up for this site"
)
RESPONSE_TOO_LARGE = ProblemType(
    "response-too-large-to-replay", 410, "The stored response is too large to replay"
)

ALL = (
    MISSING_KEY,
    INVALID_KEY,
    UNREADABLE_BODY,
    BODY_TOO_LARGE,
    NO_PRINCIPAL,
    INVALID_SIGNATURE,
    KEY_REUSED,
    IN_FLIGHT,
    LEASE_LOST,
    STORE_UNAVAILABLE,
    STORE_NOT_SET_UP,
    RESPONSE_TOO_LARGE,
)


def problem_response(
    problem: ProblemType,
    detail: str,
    *,
    retry_after: int | None = None,
    extensions: Mapping[str, Any] | None = None,
) -> HttpResponse:
    """Build the problem+json response for ``problem``.

    Args:
        problem: one of this module's ``ProblemType`` constants.
        detail: a sentence for the client: what happened and what to do.
        retry_after: seconds for a ``Retry-After`` header (RFC 9110 §10.2.3), if any.
        extensions: extra JSON members (RFC 9457 §3.2), e.g. ``{"original_status": 201}``;
            they never override the four standard members.

    Returns:
        An ``HttpResponse`` with status ``problem.status`` and a JSON body holding
        ``type``, ``title``, ``status`` and ``detail``.
    """
    body: dict[str, Any] = {
        "type": conf.problem_type_base + problem.slug,
        "title": problem.title,
        "status": problem.status,
        "detail": detail,
    }
    for name, value in (extensions or {}).items():
        body.setdefault(name, value)
    response = HttpResponse(json.dumps(body), status=problem.status, content_type=CONTENT_TYPE)
    if retry_after is not None:
        response["Retry-After"] = str(max(0, int(retry_after)))
    return response
