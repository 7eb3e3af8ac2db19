"""Verifying webhook signatures, for ``principals.signed_principal`` (docs/inbox.md).

Senders sign the raw request body with a secret they share with the receiver,
HMAC-SHA256 (RFC 2104) in most cases, and send the digest in a header: GitHub's
``X-Hub-Signature-256: sha256=<hex>``, for example. :func:`hmac_signature` checks
that form; senders with a scheme of their own (Stripe's ``Stripe-Signature``
timestamped ``t=...,v1=...``) are checked with their SDK or a function of your own,
``callable(request) -> bool``. Digests are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

Secret = str | bytes | Callable[[], "str | bytes"]


def _secret_bytes(secret: Secret) -> bytes:
    value = secret() if callable(secret) else secret
    return value.encode() if isinstance(value, str) else bytes(value)


def raw_body(request: Any) -> bytes:
    """The request body as sent (on a DRF ``Request``, its Django request's)."""
    return bytes(getattr(request, "_request", request).body)


def hmac_signature(
    secret: Secret, header: str, *, prefix: str = "sha256=", digest: str = "sha256"
) -> Callable[[Any], bool]:
    """A verifier for ``<header>: <prefix><hex HMAC of the raw body>``.

    Args:
        secret: the shared secret, or a callable returning it (read on every request,
            so a rotated setting applies at once). An empty secret verifies nothing.
        header: the header carrying the signature (``"X-Hub-Signature-256"``).
        prefix: text before the hexadecimal digest (``"sha256="``; ``""`` for none).
        digest: the ``hashlib`` name of the hash (``"sha256"``).

    Returns:
        ``callable(request) -> bool``: true when the header is present and its digest
        is the HMAC of the body under ``secret``.
    """

    def verify(request: Any) -> bool:
        key = _secret_bytes(secret)
        sent = getattr(request, "_request", request).headers.get(header, "")
        if not key or not sent.startswith(prefix):
            return False
        expected = hmac.new(key, raw_body(request), getattr(hashlib, digest)).hexdigest()
        return hmac.compare_digest(expected, sent[len(prefix) :].strip().lower())

    return verify


def sign(secret: str | bytes, body: bytes, *, prefix: str = "sha256=") -> str:
    """The header value :func:`hmac_signature` accepts for ``body`` (for senders, tests)."""
    return prefix + hmac.new(_secret_bytes(secret), body, hashlib.sha256).hexdigest()
