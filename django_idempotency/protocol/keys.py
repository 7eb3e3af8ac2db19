"""Idempotency keys: the ``Idempotency-Key`` header, key extractors' keys, derived keys.

* :func:`parse_key`: the header (below); :func:`extract` and :func:`check_key`: a key
  taken from elsewhere (a view's ``key=`` extractor, ``inbox.once()``'s argument), held
  to the header's alphabet and length;
* :func:`derive_key`: a stable sub-key for a downstream system (docs/phases.md), a pure
  function, importable before Django is set up.

Two spellings of the header are accepted (docs/protocol.md#the-idempotency-key-header):

* the IETF draft's Structured Field String (draft-ietf-httpapi-idempotency-key-header
  §2, RFC 9651 §3.3.3), e.g. ``"8e03978e-40d5-43e8-bc93-6894a57f9324"``, parsed with
  the ``http-sfv`` library;
* a bare value, Stripe style, e.g. ``8e03978e-40d5-43e8-bc93-6894a57f9324``.

Both name the same key: ``"abc"`` and ``abc`` are one key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import http_sfv

from django_idempotency.exceptions import InvalidKey

#: A key extractor (``key=``): ``callable(request) -> str | None`` (``extractors``).
KeyExtractor = Callable[[Any], "str | None"]

HEADER = "Idempotency-Key"

#: The attribute of a DRF renderer whose rendered forms carry the key in a form field:
#: its value names the field (``contrib.browsable.IdempotentBrowsableAPIRenderer``).
FORM_KEY_ATTRIBUTE = "idempotency_key_field"
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


def form_key(request: Any, http: Any, *, max_length: int) -> str | None:
    """The key a form of DRF's browsable API carries, for a request without the header.

    Read only from a form POST that negotiated a renderer with
    :data:`FORM_KEY_ATTRIBUTE` (``request.accepted_renderer``: the request asked for
    the browsable page, whose forms hold that field). An API client that asks for
    another media type is never read for the field, and a request without it has no
    key (400 ``missing-key`` where a key is required).

    Args:
        request: the DRF ``Request`` (or a Django ``HttpRequest``, which has no renderer).
        http: the Django ``HttpRequest``.
        max_length: longest accepted key, in characters.

    Returns:
        The key (as :func:`parse_key` returns it), or ``None``.

    Raises:
        InvalidKey: the field holds no valid key (see :func:`parse_key`).
    """
    field = getattr(getattr(request, "accepted_renderer", None), FORM_KEY_ATTRIBUTE, None)
    if not isinstance(field, str) or not field or http.method != "POST":
        return None
    if (http.content_type or "").lower() not in _FORM_TYPES:
        return None
    return parse_key(http.POST.get(field), max_length=max_length)


def _check_chars(value: str) -> None:
    for index, char in enumerate(value):
        if not 0x20 <= ord(char) <= 0x7E:
            raise InvalidKey(
                "The Idempotency-Key must be printable ASCII; it contains "
                f"{_as_sent(value, index)}."
            )


def _as_sent(value: str, index: int) -> str:
    """The character at ``value[index]`` as the client sent it, for a message.

    WSGI and ASGI servers hand header values over decoded as ISO-8859-1 (PEP 3333), so
    a client's UTF-8 ``é`` arrives as ``Ã©``. The bytes are recovered and, where they
    start a UTF-8 sequence, the character is named as the client wrote it, with its
    bytes; a byte that starts none is named as a byte.
    """
    try:
        raw = value[index : index + 4].encode("latin-1")
    except UnicodeEncodeError:  # not from a header's bytes: the character itself
        return f"the character {value[index]!r}"
    if raw[0] < 0x80:
        return f"the control character {value[index]!r}"
    for length in range(2, len(raw) + 1):
        try:
            char = raw[:length].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return f"the character {char!r} (UTF-8 bytes {raw[:length].hex(' ').upper()})"
    return f"the byte 0x{raw[0]:02X}, which is not UTF-8"


def _string_fault(value: str) -> str:
    r"""Why ``value`` (printable ASCII, opening with ``"``) is not one ``sf-string``.

    The rules of RFC 9651 §3.3.3: only ``\"`` and ``\\`` are escapes, and the string
    ends at its closing quote. ``""`` when none of them is broken (the parser's own
    reason then stands). The key itself is never echoed.
    """
    index = 1
    while index < len(value):
        char = value[index]
        if char == "\\":
            if index + 1 == len(value):
                return "it ends inside an escape (a backslash before nothing)"
            if value[index + 1] not in '"\\':
                return f'the escape \\{value[index + 1]} is not allowed; only \\" and \\\\ are'
            index += 2
            continue
        if char == '"':
            rest = value[index + 1 :].lstrip(" ")
            if rest.startswith(","):
                return "it holds several values (the header may appear only once)"
            return "text follows the closing quote" if rest and rest[0] != ";" else ""
        index += 1
    return "the closing quote is missing"


def parse_key(raw: str | None, *, max_length: int) -> str | None:
    """Return the key carried by a raw header value, or ``None`` when there is none.

    Args:
        raw: the header value as received (``None`` or empty when absent).
        max_length: longest accepted key, in characters.

    Returns:
        The key as a ``str`` of 1..``max_length`` printable ASCII characters.

    Raises:
        InvalidKey: the value is empty after trimming, too long, not printable ASCII,
            an unparseable Structured Field, or looks like several header lines joined
            by a comma (the header may appear only once).
    """
    if raw is None:
        return None
    value = raw.strip(" \t")
    if not value:
        raise InvalidKey("The Idempotency-Key header is empty; send 1 or more characters.")
    if value.startswith('"'):
        _check_chars(value)  # a Structured Field String is printable ASCII too
        item = http_sfv.Item()  # type: ignore[attr-defined]  # re-exported, no __all__
        try:
            item.parse(value.encode("ascii"))
        except ValueError as exc:
            reason = _string_fault(value) or str(exc) or "it is not one quoted string"
            raise InvalidKey(
                "The Idempotency-Key is not a valid Structured Field String "
                f"(RFC 9651 §3.3.3): {reason}. Send one header with one quoted value, "
                'e.g. Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324".'
            ) from None
        if not isinstance(item.value, str):
            raise InvalidKey("The Idempotency-Key must be a string.")
        key = item.value  # printable ASCII: the quoted value was checked above
    else:
        if "," in value:
            raise InvalidKey(
                "The Idempotency-Key header appears more than once or contains a comma; "
                "send exactly one key."
            )
        _check_chars(value)  # printable ASCII (0x20-0x7E), inner spaces included
        key = value
    if not key:
        raise InvalidKey("The Idempotency-Key is empty; send 1 or more characters.")
    if len(key) > max_length:
        raise InvalidKey(
            f"The Idempotency-Key is {len(key)} characters long; the limit is "
            f"{max_length}. A UUID (36 characters) is a good key."
        )
    return key


def source(extractor: KeyExtractor) -> str:
    """What the problems call the place ``extractor`` reads its key from."""
    return str(getattr(extractor, "source", "the field this endpoint takes its key from"))


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
    return check_key(
        key,
        where=where,
        max_length=max_length,
        from_header=getattr(extractor, "from_header", False) is True,
    )


def check_key(key: Any, *, where: str, max_length: int, from_header: bool = False) -> str:
    """``key`` if it is a usable idempotency key: 1 to ``max_length`` printable ASCII.

    Args:
        key: the candidate.
        where: where it came from, for the message (``"the svix-id header"``).
        max_length: longest accepted key, in characters.
        from_header: the key is a header's value, decoded as ISO-8859-1 as every
            header is: a refused character is named as the client sent it.

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
    for index, char in enumerate(key):
        if not 0x20 <= ord(char) <= 0x7E:
            named = _as_sent(key, index) if from_header else f"the character {char!r}"
            raise InvalidKey(
                f"The idempotency key from {where} must be printable ASCII; it contains {named}."
            )
    return key


#: Prefix of every derived key.
DERIVED_KEY_PREFIX = "idk_"
#: Domain-separation tag hashed before the inputs; bumping it changes every key.
_DERIVE_TAG = b"django-idempotency:derive-key:v1"


def derive_key(principal: str, endpoint: str, key: str, name: str) -> str:
    """A stable sub-key for a downstream system, from the record's scope and ``name``.

    Format (stable across processes and releases): ``"idk_"`` followed by 32 lowercase
    hexadecimal characters (``[0-9a-f]``), 36 characters in all. The hex part is the
    first 128 bits of SHA-256 over the tag ``b"django-idempotency:derive-key:v1"`` and
    then, for each of ``principal``, ``endpoint``, ``key`` and ``name`` in this order,
    its UTF-8 length as a 4-byte big-endian integer followed by its UTF-8 bytes. The
    length framing keeps ``("ab", "c")`` and ``("a", "bc")`` apart. No secret is
    involved: the key is an identifier, not a credential.

    Args:
        principal: the record's principal (``request.idempotency.principal``).
        endpoint: the record's endpoint (``"POST /v1/workers"``).
        key: the client's idempotency key.
        name: what the sub-key is for (``"boot"``), chosen by the view.

    Returns:
        The derived key, e.g. ``"idk_3f0c..."`` (36 characters).
    """
    digest = hashlib.sha256(_DERIVE_TAG)
    for part in (principal, endpoint, key, name):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(4, "big"))
        digest.update(data)
    return DERIVED_KEY_PREFIX + digest.hexdigest()[:32]
