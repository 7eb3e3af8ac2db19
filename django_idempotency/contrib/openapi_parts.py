"""What the OpenAPI integrations declare on a protected operation (drf-spectacular, Ninja).

The problem+json schema, the descriptions of the ``400``/``409``/``422`` responses and
of the ``Idempotency-Key`` header, and the ``x-idempotency`` key policy: shared by
``contrib.openapi`` and ``contrib.ninja`` so both publish the same contract. Imports no
third-party package.
"""

from __future__ import annotations

from typing import Any

from django_idempotency.protocol.keys import HEADER
from django_idempotency.protocol.options import Options

#: Name of the problem+json schema component.
PROBLEM_COMPONENT = "IdempotencyProblem"

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem detail produced by django-idempotency.",
    "properties": {
        "type": {"type": "string", "format": "uri", "description": "Stable problem type URI."},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "What happened and what to do."},
    },
    "required": ["type", "title", "status", "detail"],
}

PROBLEM_RESPONSES = {
    "400": "The Idempotency-Key header is missing (on an endpoint that requires it) or "
    "invalid, or the request body could not be read. Nothing was done.",
    "409": "A request with this Idempotency-Key is still in flight, or this request "
    "lost its claim. Retry after Retry-After seconds with the same key.",
    "422": "This Idempotency-Key was already used with a different request.",
}


#: Name of the operation extension that publishes the key policy (docs/openapi.md).
EXTENSION = "x-idempotency"

#: (seconds, unit, smallest count written in that unit): one day reads "24 hours".
_UNITS = ((86400, "day", 2), (3600, "hour", 1), (60, "minute", 1))


def duration(seconds: float) -> str:
    """``seconds`` in words: ``"24 hours"``, ``"7 days"``, ``"90 seconds"``.

    The largest unit (days from 2 days on, hours, minutes) that divides ``seconds``
    exactly, else seconds.
    """
    for size, unit, smallest in _UNITS:
        if seconds >= size * smallest and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    count_text = f"{seconds:g}"
    return f"{count_text} second{'' if count_text == '1' else 's'}"


def policy(options: Options) -> dict[str, Any]:
    """The key policy of an operation protected by ``options``, as published.

    ``retentionSeconds``: how long a key is remembered after its first use (a retry
    within it replays the first response; after it, the key is new).
    ``leaseSeconds``: how long an unfinished request holds its key (duplicates get 409)
    before a retry may take it over. ``required``: whether a request needs a key.
    ``header``: ``Idempotency-Key``, or ``null`` when the view takes its key from
    elsewhere in the request (``key=``, a webhook's event id: docs/inbox.md).
    """
    return {
        "header": HEADER if options.key is None else None,
        "required": options.get_required(),
        "retentionSeconds": options.get_retention(),
        "leaseSeconds": options.get_lease(),
    }


def header_description(options: Options) -> str:
    """The description of the ``Idempotency-Key`` header on an operation with ``options``."""
    optional = (
        "" if options.get_required() else " Optional: without it the request is not protected."
    )
    retention, lease = duration(options.get_retention()), duration(options.get_lease())
    return (
        "A unique key per operation (a UUID); send the same key on every retry. A retry "
        f"replays the first response instead of running again.{optional} Retention "
        f"window: {retention} after the first request; a retry within it gets the first "
        f"response, after it the key is new. Lease: {lease}; while the first request "
        "runs, a retry gets 409 with Retry-After, and a request that stopped without an "
        "answer is taken over by a retry once its lease is over."
    )
