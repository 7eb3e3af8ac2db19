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
from typing import Any

from django.http.request import RawPostDataException

from django_idempotency.exceptions import InvalidKey
from django_idempotency.protocol.keys import KeyExtractor, source

__all__ = ["KeyExtractor", "body_field", "combined", "header"]


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

    # Its value arrives decoded as ISO-8859-1, as every header does: the key check
    # names a refused character as the client sent it (protocol.keys).
    from_header.from_header = True  # type: ignore[attr-defined]
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
