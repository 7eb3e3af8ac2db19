"""The client side: send a mutating request with an ``Idempotency-Key`` and retry it safely.

Built on httpx (HTTP) and stamina (the retry loop); install them with the extra::

    pip install "django-idempotency[client]"

One *logical operation* gets one key, minted before its first attempt and sent on
every retry. The client retries network errors, 5xx answers (but 501, 505 and the 500
``store-not-set-up``) and the 409s that mean "retry me" (problem types
``request-in-flight`` and ``lease-lost``), with exponential backoff and full jitter,
never sooner than ``Retry-After``. It never retries any other 4xx (422 above all: the
key was reused for another request). A replay (``Idempotent-Replayed: true``) is a
success like the first answer. See ``docs/client.md``.

Usage::

    with IdempotentClient("https://api.example.com", headers={"Authorization": "..."}) as api:
        response = api.post("/v1/workers", json={"image": "ubuntu-24.04"},
                             operation="order-42/worker")
        worker = response.json()

This package needs no Django; ``django_idempotency`` itself imports without httpx.
Its modules, one concern each: ``responses`` (reading an answer and the verdict),
``backoff``, ``errors`` (attempt events and exceptions), ``policy`` (what both clients
decide), ``logs`` (their log lines), ``sync`` and ``aio`` (the two clients). Keys are kept by
``keystore`` (standard library only).
"""

from __future__ import annotations

try:
    import httpx  # noqa: F401
    import stamina  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        f"django_idempotency.client needs httpx and stamina ({exc.name} is missing). "
        "Install them with: pip install 'django-idempotency[client]'"
    ) from exc

from django_idempotency.client.aio import AsyncIdempotentClient
from django_idempotency.client.backoff import Backoff
from django_idempotency.client.errors import (
    AttemptEvent,
    IdempotentRequestError,
    NonRetryableError,
    ResponseNotReplayable,
    RetriesExhausted,
)
from django_idempotency.client.keystore import KeyStore, MemoryKeyStore, SQLiteKeyStore
from django_idempotency.client.responses import (
    RELEASED_4XX,
    is_replay,
    problem_of,
    problem_slug,
    retry_after_seconds,
    verdict,
)
from django_idempotency.client.sync import IdempotentClient

__all__ = [
    "RELEASED_4XX",
    "AsyncIdempotentClient",
    "AttemptEvent",
    "Backoff",
    "IdempotentClient",
    "IdempotentRequestError",
    "KeyStore",
    "MemoryKeyStore",
    "NonRetryableError",
    "ResponseNotReplayable",
    "RetriesExhausted",
    "SQLiteKeyStore",
    "is_replay",
    "problem_of",
    "problem_slug",
    "retry_after_seconds",
    "verdict",
]
