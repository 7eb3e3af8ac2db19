from __future__ import annotations

import pytest

from django_idempotency.keys import InvalidKey, parse_key


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
        ('"caf\u00e9"', "Structured Field"),
        ("tab\there", "printable ASCII"),
        ("a,b", "more than once"),
        ('"a", "b"', "Structured Field"),
        ('"unterminated', "Structured Field"),
        ("\x00", "printable ASCII"),
    ],
)
def test_invalid_keys(raw, message):
    with pytest.raises(InvalidKey, match=message):
        parse_key(raw, max_length=255)


def test_configured_max_length():
    assert parse_key("x" * 10, max_length=10) == "x" * 10
    with pytest.raises(InvalidKey, match="limit is 9"):
        parse_key("x" * 10, max_length=9)


def test_quoted_and_bare_spellings_name_one_key():
    assert parse_key('"k-1"', max_length=255) == parse_key("k-1", max_length=255)
