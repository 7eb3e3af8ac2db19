"""Who a request runs as: the principal that scopes its keys (docs/usage.md).

A resolver is ``callable(request) -> str | None``. ``None`` means "no principal that
can scope a key safely": the request is refused with 401 when it carries a key. Two
principals never share records, so the resolver must return a value that is stable for
one identity and distinct between identities. Configure one with
``IDEMPOTENCY["PRINCIPAL_RESOLVER"]`` (dotted path) or per view (``principal=``).

Webhook senders do not log in; :func:`signed_principal` grants them a principal for
the deliveries they signed (docs/inbox.md). They sign the raw request body with a
secret they share with the receiver, HMAC-SHA256 (RFC 2104) in most cases, and send
the digest in a header: GitHub's ``X-Hub-Signature-256: sha256=<hex>``, for example.
:func:`hmac_signature` checks that form; senders with a scheme of their own (Stripe's
``Stripe-Signature``, timestamped ``t=...,v1=...``) are checked with their SDK or a
function of your own, ``callable(request) -> bool``. Digests are compared as bytes, in
constant time. A header that is not exactly the expected form is a refusal, never an
error: absent, another prefix (``sha1=`` where ``sha256=`` is expected), anything but
hexadecimal digits after it (white space inside, characters outside ASCII), or a
digest of the wrong length. Surrounding white space is not part of a field value
(RFC 9110 §5.5); hexadecimal digits may be of either case (RFC 4648 §8). A refused
delivery answers 403 ``invalid-signature`` with what was wrong: the header missing,
malformed, or its digest not that of the body.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Callable
from typing import Any

from django_idempotency.exceptions import SignatureRefused


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
    ``name`` to a request whose signature ``verify`` accepts, and refuses every other
    request with :class:`~django_idempotency.exceptions.SignatureRefused`, which the
    view answers 403 ``invalid-signature`` before the claim (the view never runs). So
    unsigned requests never share the sender's key space: nobody else can claim,
    replay or block its event ids. Every other view keeps its own resolver; nothing
    opens anonymous scoping to everyone.

    Args:
        name: the principal, one per sender (``"webhook:stripe"``); 1 to 255 characters.
        verify: ``callable(request) -> bool``, true when the request's signature is
            valid (``hmac_signature`` below, or the sender's SDK). A verifier with a
            ``refusal(request) -> str | None`` method (``hmac_signature``'s) also says
            why a request is refused, and the 403 says it too. Exceptions it raises
            propagate.

    Raises:
        ValueError: ``name`` is empty.
    """
    if not name:
        raise ValueError("signed_principal() needs a non-empty principal name")
    refusal: Callable[[Any], str | None] | None = getattr(verify, "refusal", None)

    def resolve(request: Any) -> str:
        """``name`` for a request ``verify`` accepts.

        Raises:
            SignatureRefused: the signature is missing, malformed or does not match.
        """
        if refusal is not None:
            reason = refusal(request)
        else:
            reason = None if verify(request) else "it is missing or does not match the body"
        if reason is None:
            return name
        raise SignatureRefused(
            f"The request's signature is refused: {reason}. Nothing was claimed or run; "
            "sign the raw body with the shared secret and send it again."
        )

    resolve.__qualname__ = f"signed_principal({name!r})"
    return resolve


Secret = str | bytes | Callable[[], "str | bytes"]

logger = logging.getLogger("django_idempotency")


def _secret_bytes(value: object) -> bytes:
    """``value`` as key bytes; ``b""`` for anything that is not a non-empty secret."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return b""


def _fixed_secret(secret: object, caller: str) -> bytes:
    """A secret given as a value: its bytes; empty or of another type is refused.

    Raises:
        TypeError: ``secret`` is neither ``str`` nor ``bytes``.
        ValueError: ``secret`` is empty.
    """
    if not isinstance(secret, (str, bytes, bytearray)):
        raise TypeError(
            f"{caller}: the secret is a str, bytes or a callable returning one, "
            f"not {type(secret).__name__}"
        )
    if not secret:
        raise ValueError(
            f"{caller}: the secret is empty, so every signature would be refused (or, "
            "with an empty key, anyone could sign). Set the secret the sender signs with."
        )
    return _secret_bytes(secret)


def _digest_size(digest: str, caller: str) -> int:
    try:
        return hashlib.new(digest).digest_size
    except (ValueError, TypeError):
        raise ValueError(f"{caller}: {digest!r} is not a hashlib algorithm") from None


def raw_body(request: Any) -> bytes:
    """The request body as sent (on a DRF ``Request``, its Django request's)."""
    return bytes(getattr(request, "_request", request).body)


def hmac_signature(
    secret: Secret, header: str, *, prefix: str = "sha256=", digest: str = "sha256"
) -> Callable[[Any], bool]:
    """A verifier for ``<header>: <prefix><hex HMAC of the raw body>``.

    Args:
        secret: the shared secret (``str``, encoded as UTF-8, or ``bytes``), or a
            callable returning it, read on every request so a rotated setting applies at
            once. A callable that returns an empty secret (or anything but ``str`` or
            ``bytes``) refuses every request and logs an error each time.
        header: the header carrying the signature (``"X-Hub-Signature-256"``).
        prefix: text before the hexadecimal digest, compared exactly (``"sha256="``;
            ``""`` for none).
        digest: the ``hashlib`` name of the hash (``"sha256"``).

    Returns:
        ``callable(request) -> bool``: true when the header is the prefix followed by
        exactly the hexadecimal HMAC of the raw body under ``secret``; false for every
        other request, whatever its header holds (it never raises for a header). Its
        ``refusal(request)`` method says why a request is refused (``None`` when it is
        not): the header missing, malformed, or its digest not the body's;
        :func:`signed_principal` puts that in the 403.

    Raises:
        ValueError: ``secret`` is given as a value and empty, or ``digest`` is not a
            hash ``hashlib`` knows.
        TypeError: ``secret`` is neither ``str``, ``bytes`` nor callable.
    """
    caller = f"hmac_signature({header!r})"
    fixed = None if callable(secret) else _fixed_secret(secret, caller)
    size = _digest_size(digest, caller)
    return _HmacVerifier(caller, secret, fixed, header, prefix, digest, size)


class _HmacVerifier:
    """What :func:`hmac_signature` returns: a verifier that can also say why it refuses."""

    def __init__(
        self,
        caller: str,
        secret: Secret,
        fixed: bytes | None,
        header: str,
        prefix: str,
        digest: str,
        size: int,
    ) -> None:
        self.caller, self.secret, self.fixed = caller, secret, fixed
        self.header, self.prefix, self.digest = header, prefix, digest
        self.hex_digest = re.compile(f"[0-9a-fA-F]{{{2 * size}}}", re.ASCII)
        self.expected_form = f"{prefix!r} and {2 * size} hexadecimal digits"
        if not prefix:
            self.expected_form = f"{2 * size} hexadecimal digits"

    def __call__(self, request: Any) -> bool:
        return self.refusal(request) is None

    def refusal(self, request: Any) -> str | None:
        """Why ``request``'s signature is refused, for the client; ``None`` if it is valid.

        Never quotes the header's value; never raises for what the header holds.
        """
        key = self.fixed if self.fixed is not None else _secret_bytes(self.secret())  # type: ignore[operator]
        if not key:
            logger.error(
                "%s: the secret callable returned no secret: every delivery is refused",
                self.caller,
            )
            return "the receiver could not check it"
        sent = getattr(request, "_request", request).headers.get(self.header)
        if not isinstance(sent, str):
            return f"the {self.header} header is missing"
        sent = sent.strip(" \t")
        hex_value = sent[len(self.prefix) :]
        if not sent.startswith(self.prefix) or not self.hex_digest.fullmatch(hex_value):
            return f"the {self.header} header is malformed (expected {self.expected_form})"
        expected = hmac.new(key, raw_body(request), self.digest).digest()
        if not hmac.compare_digest(expected, bytes.fromhex(hex_value)):
            return f"the {self.header} digest does not match the body"
        return None


def sign(
    secret: str | bytes, body: bytes, *, prefix: str = "sha256=", digest: str = "sha256"
) -> str:
    """The header value :func:`hmac_signature` accepts for ``body`` (for senders, tests).

    Args:
        secret: the shared secret (``str``, encoded as UTF-8, or ``bytes``).
        body: the raw body to sign.
        prefix: text before the hexadecimal digest.
        digest: the ``hashlib`` name of the hash.

    Raises:
        ValueError: ``secret`` is empty.
        TypeError: ``secret`` is neither ``str`` nor ``bytes``.
    """
    key = _fixed_secret(secret, "sign()")
    return prefix + hmac.new(key, body, digest).hexdigest()
