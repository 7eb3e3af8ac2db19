"""Parse and validate the ``Idempotency-Key`` request header.

Two spellings are accepted (docs/protocol.md#the-idempotency-key-header):

* the IETF draft's Structured Field String (draft-ietf-httpapi-idempotency-key-header
  §2, RFC 9651 §3.3.3), e.g. ``"8e03978e-40d5-43e8-bc93-6894a57f9324"``, parsed with
  the ``http-sfv`` library;
* a bare value, Stripe style, e.g. ``8e03978e-40d5-43e8-bc93-6894a57f9324``.

Both name the same key: ``"abc"`` and ``abc`` are one key.
"""

from __future__ import annotations

import http_sfv

from django_idempotency.exceptions import InvalidKey

HEADER = "Idempotency-Key"


def _check_chars(value: str) -> None:
    for char in value:
        if not 0x20 <= ord(char) <= 0x7E:
            raise InvalidKey(
                f"The Idempotency-Key must be printable ASCII; it contains the character {char!r}."
            )


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
