"""Idempotency keys taken from elsewhere in the request: webhook receivers (docs/inbox.md).

Webhook senders never send ``Idempotency-Key``; each delivery carries the sender's own
event id instead, in a header of its choosing (GitHub's ``X-GitHub-Delivery``, Svix's
``svix-id``) or in the body (Stripe's ``{"id": "evt_..."}``). A view's ``key=`` option
names a *key extractor*, ``callable(request) -> str | None``, and the protocol
(claim, fenced completion, replay, 409, 422) runs on the key it returns.

An extractor returns ``None`` when the request carries no key (a 400
``missing-key`` on a view that requires one), and raises :class:`InvalidKey` when
it carries an unusable one (a 400 ``invalid-key``). ``LookupError``, ``TypeError``
and ``ValueError`` raised by an extractor count as an unusable key too, so a body
that is not the JSON object an extractor expected is a 400, never a 500.

Each extractor may carry a ``source`` attribute (``"the X-GitHub-Delivery header"``),
which the 400 problems name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.http.request import RawPostDataException

from django_idempotency.exceptions import InvalidKey

KeyExtractor = Callable[[Any], "str | None"]

__all__ = [
    "KeyExtractor",
    "body_field",
    "check_key",
    "combined",
    "extract",
    "header",
    "source",
]


def source(extractor: KeyExtractor) -> str:
    """What the problems call the place ``extractor`` reads its key from."""
    return str(getattr(extractor, "source", "the field this endpoint takes its key from"))


def _with_source(func: KeyExtractor, where: str) -> KeyExtractor:
    func.source = where  # type: ignore[attr-defined]
    return func


def header(name: str) -> KeyExtractor:
    """The value of request header ``name`` (``"X-GitHub-Delivery"``, ``"svix-id"``).

    Args:
        name: the header's name, any case.

    Returns:
        An extractor returning the header's value with surrounding blanks removed,
        ``None`` when the header is absent or blank.
    """

    def from_header(request: Any) -> str | None:
        http = getattr(request, "_request", request)
        value = http.headers.get(name)
        if value is None or not value.strip(" \t"):
            return None
        return str(value.strip(" \t"))

    return _with_source(from_header, f"the {name} header")


def _json_body(request: Any) -> Any:
    http = getattr(request, "_request", request)
    try:
        raw = http.body
    except RawPostDataException:  # DRF read the stream first: use what it parsed
        return request.data
    return json.loads(raw) if raw else None


def body_field(path: str) -> KeyExtractor:
    """A field of the JSON request body: ``"id"`` (Stripe events), ``"data.event_id"``.

    Args:
        path: dotted path into nested JSON objects.

    Returns:
        An extractor returning the field's value (a string, or an integer as its
        decimal digits), ``None`` when a step of the path is absent. A body that is
        not JSON, or a field that is neither a string nor an integer, is an unusable
        key (400 ``invalid-key``).
    """
    steps = path.split(".")
    where = f"the {path!r} field of the JSON body"

    def from_body(request: Any) -> str | None:
        try:
            value = _json_body(request)
        except (ValueError, UnicodeDecodeError):
            raise InvalidKey(f"The request body is not JSON, so {where} cannot be read.") from None
        for step in steps:
            if not isinstance(value, dict):
                raise InvalidKey(f"The request body has no JSON object where {where} should be.")
            if step not in value:
                return None
            value = value[step]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise InvalidKey(f"{where[0].upper()}{where[1:]} must be a string, not {value!r}.")
        return str(value)

    return _with_source(from_body, where)


def combined(*extractors: KeyExtractor, separator: str = ":") -> KeyExtractor:
    """Several parts joined into one key (``combined(header("X-Source"), body_field("id"))``).

    Args:
        extractors: the parts, in order.
        separator: put between the parts.

    Returns:
        An extractor returning the joined key, ``None`` if any part is missing.
    """
    if not extractors:
        raise TypeError("combined() needs at least one extractor")

    def from_parts(request: Any) -> str | None:
        parts = [extractor(request) for extractor in extractors]
        if any(part is None for part in parts):
            return None
        return separator.join(str(part) for part in parts)

    return _with_source(from_parts, " and ".join(source(e) for e in extractors))


def extract(extractor: KeyExtractor, request: Any, *, max_length: int) -> str | None:
    """Run ``extractor`` on ``request`` and check its key.

    Args:
        extractor: the view's ``key=``.
        request: the Django ``HttpRequest`` or DRF ``Request``.
        max_length: longest accepted key, in characters (``MAX_KEY_LENGTH``).

    Returns:
        The key: 1 to ``max_length`` printable ASCII characters; ``None`` when the
        extractor found none.

    Raises:
        InvalidKey: the key is unusable (``str(exc)`` is the client-facing detail):
            not a string, empty, too long or not printable ASCII, or the extractor
            raised ``InvalidKey``, ``LookupError``, ``TypeError`` or ``ValueError``.
    """
    where = source(extractor)
    try:
        key = extractor(request)
    except InvalidKey:
        raise
    except (LookupError, TypeError, ValueError) as exc:
        raise InvalidKey(
            f"The idempotency key could not be read from {where} ({type(exc).__name__})."
        ) from None
    if key is None:
        return None
    return check_key(key, where=where, max_length=max_length)


def check_key(key: Any, *, where: str, max_length: int) -> str:
    """``key`` if it is a usable idempotency key: 1 to ``max_length`` printable ASCII.

    Args:
        key: the candidate.
        where: where it came from, for the message (``"the svix-id header"``).
        max_length: longest accepted key, in characters.

    Raises:
        InvalidKey: not a string, empty, too long, or not printable ASCII (0x20-0x7E,
            the alphabet of the ``Idempotency-Key`` header).
    """
    if not isinstance(key, str):
        raise InvalidKey(f"The idempotency key from {where} is not a string.")
    if not key:
        raise InvalidKey(f"The idempotency key from {where} is empty.")
    if len(key) > max_length:
        raise InvalidKey(
            f"The idempotency key from {where} is {len(key)} characters long; the limit "
            f"is {max_length}."
        )
    for char in key:
        if not 0x20 <= ord(char) <= 0x7E:
            raise InvalidKey(
                f"The idempotency key from {where} must be printable ASCII; it contains "
                f"the character {char!r}."
            )
    return key
