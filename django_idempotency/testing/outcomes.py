"""Sending one request with a key, and telling its kind of answer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from django_idempotency.conf import conf
from django_idempotency.protocol.keys import HEADER

#: What a test client's ``client_factory`` returns: Django's ``Client`` or DRF's
#: ``APIClient`` (anything with ``post``, ``put``, ``patch``, ``delete`` methods).
TestClient = Any
ClientFactory = Callable[[], TestClient]
Kind = Literal["original", "replay", "in-flight", "lease-lost", "unavailable", "other"]

_HEADER_META = "HTTP_" + HEADER.upper().replace("-", "_")
_PROBLEM_KINDS: dict[str, Kind] = {
    "request-in-flight": "in-flight",
    "lease-lost": "lease-lost",
    "store-unavailable": "unavailable",
}


def send(
    client_factory: ClientFactory,
    method: str,
    path: str,
    data: Any,
    key: str,
    extra: dict[str, Any],
) -> Any:
    """Send ``method path`` with ``Idempotency-Key: key`` through a new test client."""
    client = client_factory()
    return getattr(client, method.lower())(path, data, **{_HEADER_META: key, **extra})


def problem_slug(response: Any) -> str | None:
    """The slug of a problem this app answered (``"request-in-flight"``...), or ``None``.

    ``None`` too for a problem+json of the view itself: its ``type`` does not start with
    ``PROBLEM_TYPE_BASE``.
    """
    if not response.get("Content-Type", "").startswith("application/problem+json"):
        return None
    try:
        kind = str(json.loads(response.content).get("type", ""))
    except (ValueError, AttributeError):
        return None
    base = conf.problem_type_base
    return kind[len(base) :] if kind.startswith(base) else None


def is_replay(response: Any) -> bool:
    """Whether ``response`` carries ``Idempotent-Replayed: true``."""
    return str(response.get("Idempotent-Replayed", "")).lower() == "true"


def kind_of(response: Any) -> Kind:
    """The kind of answer ``response`` is, for the assertions.

    ``"replay"``, ``"in-flight"`` (409), ``"lease-lost"`` (409), ``"unavailable"`` (503),
    ``"other"`` (another answer of this app: 400, 422...), or ``"original"``: an answer
    of the view itself (any status, a 4xx included).
    """
    if is_replay(response):
        return "replay"
    slug = problem_slug(response)
    if slug in _PROBLEM_KINDS:
        return _PROBLEM_KINDS[slug]
    if slug is not None:
        return "other"  # another answer of this app: a 400 missing-key, a 422...
    return "original"


def describe(response: Any) -> str:
    """``201``, ``201 replay``, ``409 request-in-flight``...: for assertion messages."""
    slug = problem_slug(response)
    suffix = " replay" if is_replay(response) else (f" {slug}" if slug else "")
    return f"{response.status_code}{suffix}"
