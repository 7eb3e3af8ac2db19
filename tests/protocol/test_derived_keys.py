"""Derived keys (docs/phases.md): a stable, documented format."""

from __future__ import annotations

import hashlib
import re
import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_idempotency import derive_key

FORMAT = re.compile(r"^idk_[0-9a-f]{32}$")


def reference(principal: str, endpoint: str, key: str, name: str) -> str:
    """docs/phases.md's definition, written out independently."""
    data = b"django-idempotency:derive-key:v1"
    for part in (principal, endpoint, key, name):
        raw = part.encode("utf-8")
        data += struct.pack(">I", len(raw)) + raw
    return "idk_" + hashlib.sha256(data).hexdigest()[:32]


def test_pinned_value():
    """Never changes across releases: downstream systems hold these ids."""
    assert (
        derive_key(
            "auth.user:42", "POST /v1/workers", "8e03978e-40d5-43e8-bc93-6894a57f9324", "boot"
        )
        == "idk_72dc204c3e3c4cd18b439cd171006e81"
    )
    assert derive_key("", "", "", "") == "idk_a98055042799c2a1a21c00ec4895729a"
    assert derive_key("ü", "POST /v1/wörkers", "ключ", "boot") == (
        "idk_40cc5187166fa9d48ae35df0da3164f7"
    )


def test_same_value_in_another_process():
    code = (
        "from django_idempotency import derive_key;"
        "print(derive_key('auth.user:42', 'POST /v1/workers', 'k', 'boot'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == derive_key("auth.user:42", "POST /v1/workers", "k", "boot")


@given(st.text(), st.text(), st.text(max_size=255), st.text(max_size=64))
def test_matches_the_documented_definition(principal, endpoint, key, name):
    try:
        "".join((principal, endpoint, key, name)).encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates: not valid in a header or a name
    value = derive_key(principal, endpoint, key, name)
    assert FORMAT.match(value)
    assert value == reference(principal, endpoint, key, name)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("p", "e", "ab", "c"), ("p", "e", "a", "bc")),  # length framing
        (("p", "e", "k", "boot"), ("p", "e", "k", "boot2")),
        (("p1", "e", "k", "boot"), ("p2", "e", "k", "boot")),  # principals apart
        (("p", "POST /a", "k", "boot"), ("p", "POST /b", "k", "boot")),
    ],
)
def test_any_input_changes_the_key(a, b):
    assert derive_key(*a) != derive_key(*b)


@pytest.mark.django_db
def test_request_idempotency_derive_key_uses_the_record_scope(api, alice, key):
    api.post("/provision", {"cpus": 2}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    from tests.support.testapp.models import Widget

    expected = derive_key(f"auth.user:{alice.user.pk}", "POST /provision", key, "worker")
    assert Widget.objects.filter(name=expected).count() == 1
