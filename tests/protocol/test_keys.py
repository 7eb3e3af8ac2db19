from __future__ import annotations

import pytest

from django_idempotency.exceptions import InvalidKey
from django_idempotency.protocol.keys import parse_key


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("abc", "abc"),
        ('"abc"', "abc"),
        ("  7c3f5d1e-91a4-4b8c-9f02-1c4a8e5b6d10 ", "7c3f5d1e-91a4-4b8c-9f02-1c4a8e5b6d10"),
        ('"7c3f5d1e-91a4-4b8c-9f02-1c4a8e5b6d10"', "7c3f5d1e-91a4-4b8c-9f02-1c4a8e5b6d10"),
        ('"with space"', "with space"),
        ("bare with space", "bare with space"),
        ('"esc\\"aped"', 'esc"aped'),
        ("x" * 255, "x" * 255),
        ("~!#$%&'*+-.^_`|", "~!#$%&'*+-.^_`|"),
    ],
)
def test_valid_keys(raw, expected):
    assert parse_key(raw, max_length=255) == expected


def test_absent_header_is_none():
    assert parse_key(None, max_length=255) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ('""', "empty"),
        ("x" * 256, "256 characters long; the limit is 255"),
        ("caf\u00e9", "printable ASCII"),
        # Header values arrive decoded as ISO-8859-1: one byte 0xE9, or UTF-8's C3 A9.
        ('"caf\u00e9"', "printable ASCII; it contains the byte 0xE9, which is not UTF-8"),
        ('"caf\u00c3\u00a9"', r"it contains the character 'é' \(UTF-8 bytes C3 A9\)"),
        ('"a\tb"', r"printable ASCII; it contains the control character '\\t'"),
        ("tab\there", "printable ASCII"),
        ("a,b", "more than once"),
        ('"a", "b"', "Structured Field String .*: it holds several values"),
        ('"unterminated', "Structured Field String .*: the closing quote is missing"),
        ('"a\\x"', "Structured Field String .*: the escape \\\\x is not allowed"),
        ('"a\\', "Structured Field String .*: it ends inside an escape"),
        ('"a"b', "Structured Field String .*: text follows the closing quote"),
        ("\x00", "printable ASCII"),
    ],
)
def test_invalid_keys(raw, message):
    with pytest.raises(InvalidKey, match=message):
        parse_key(raw, max_length=255)


@pytest.mark.parametrize("raw", ['"abc', '"a\\x"', '"a\tb"', '"clé"', '"a"b', '"a";=', '"a", "b"'])
def test_a_bad_quoted_key_says_why_and_never_echoes_the_key(raw):
    """Every refusal of a quoted key names its reason (never an empty one, never a
    codec's message) and leaves the key out of the detail."""
    with pytest.raises(InvalidKey) as caught:
        parse_key(raw, max_length=255)
    detail = str(caught.value)
    assert "): ." not in detail and "codec" not in detail, detail
    assert "abc" not in detail.replace("e.g.", ""), detail


def test_configured_max_length():
    assert parse_key("x" * 10, max_length=10) == "x" * 10
    with pytest.raises(InvalidKey, match="limit is 9"):
        parse_key("x" * 10, max_length=9)


def test_quoted_and_bare_spellings_name_one_key():
    assert parse_key('"k-1"', max_length=255) == parse_key("k-1", max_length=255)
