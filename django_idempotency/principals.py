"""Principal resolvers: who a request runs as, the scope of its keys (docs/usage.md).

A resolver is ``callable(request) -> str | None``. ``None`` means "no principal that
can scope a key safely": the request is refused with 401 when it carries a key. Two
principals never share records, so the resolver must return a value that is stable for
one identity and distinct between identities. Configure one with
``IDEMPOTENCY["PRINCIPAL_RESOLVER"]`` (dotted path) or per view (``principal=``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any


def user_principal(request: Any) -> str | None:
    """The authenticated user as ``"<app_label>.<model>:<pk>"``; ``None`` if anonymous.

    Args:
        request: a Django ``HttpRequest`` or DRF ``Request`` with ``.user``.
    """
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return f"{user._meta.label_lower}:{user.pk}"


def auth_token_principal(request: Any) -> str | None:
    """The credential the request authenticated with (DRF's ``request.auth``).

    Scopes keys per API token rather than per user, so two tokens of one user are two
    principals (Stripe scopes per account; use :func:`user_principal` for that).
    The credential is never stored: token objects are named by model label and the
    SHA-256 of their primary key (DRF's ``Token`` uses the secret itself as its
    primary key), string credentials (JWTs, API keys) by their SHA-256. Returns
    ``None`` (refused) when the request carries no credential.
    """
    auth = getattr(request, "auth", None)
    if auth is None:
        return None
    meta = getattr(auth, "_meta", None)
    label = meta.label_lower if meta is not None else "credential"
    value = str(auth.pk) if meta is not None else str(auth)
    return f"{label}:{hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()}"


def signed_principal(name: str, verify: Callable[[Any], bool]) -> Callable[[Any], str | None]:
    """A fixed principal for one sender, granted only to requests it signed (docs/inbox.md).

    A webhook sender (Stripe, GitHub, a partner's relay) does not log in; it signs
    each delivery with a secret it shares with you. The resolver this returns gives
    ``name`` to a request whose signature ``verify`` accepts, and ``None`` (refused
    with 401/403, before the claim, the view never runs) to every other request, so
    unauthenticated requests never share the sender's key space: nobody else can
    claim, replay or block its event ids. Every other view keeps its own resolver;
    nothing opens anonymous scoping to everyone.

    Args:
        name: the principal, one per sender (``"webhook:stripe"``); 1 to 255 characters.
        verify: ``callable(request) -> bool``, true when the request's signature is
            valid (``django_idempotency.signatures.hmac_signature``, or the sender's
            SDK). Exceptions it raises propagate.

    Raises:
        ValueError: ``name`` is empty.
    """
    if not name:
        raise ValueError("signed_principal() needs a non-empty principal name")

    def resolve(request: Any) -> str | None:
        return name if verify(request) else None

    resolve.__qualname__ = f"signed_principal({name!r})"
    return resolve
