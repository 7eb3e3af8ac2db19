"""A replay is the first answer, byte for byte: binary and latin-1 bodies, every header
but the per-exchange ones, a 204 without a body, and bodies up to ``MAX_RESPONSE_BYTES``
(one more byte gives 410), on PostgreSQL (docs/protocol.md, "Replay")."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from tests.support.clients import post_twice
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


URLS = pytest.mark.urls("tests.support.response_views")


@URLS
@pytest.mark.parametrize("url", ["/responses/binary", "/responses/latin1", "/responses/described"])
def test_replay_is_byte_exact_with_its_headers(api: Any, url: str) -> None:
    """docs/protocol.md "Replay": the exact status, body bytes and every header but the
    per-exchange ones (Content-Type, Content-Language, Cache-Control, Link, Vary...)."""
    first, second = post_twice(api, url)
    assert first.status_code == second.status_code == 201
    assert second.content == first.content
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    for name in ("Content-Type", "Content-Language", "Cache-Control", "Link"):
        assert second.headers.get(name) == first.headers.get(name), name
    assert second.headers.get("Vary") == first.headers.get("Vary")
    assert int(second.headers["Content-Length"]) == len(first.content)
    assert Widget.objects.count() == 1


@URLS
def test_replay_of_204_has_no_body(api: Any) -> None:
    """docs/protocol.md "Replay": a 204 replays as a 204 without a body (CommonMiddleware
    adds its Content-Length: 0 to the first answer and the replay alike)."""
    first, second = post_twice(api, "/responses/no-content")
    assert first.status_code == second.status_code == 204
    assert second.content == b""
    assert second.headers.get("Content-Length") == first.headers.get("Content-Length")
    assert Widget.objects.count() == 1


@URLS
def test_body_at_max_response_bytes_replays_and_one_more_byte_gives_410(api: Any) -> None:
    """docs/robustness.md "MAX_RESPONSE_BYTES": a body up to the limit is kept; a larger
    one is sent in full, its completion commits without the body and a retry gets 410
    with original_status and Location, the view not run again."""
    with override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": 1000}):
        first, second = post_twice(api, "/responses/sized", {"n": 1000})
        assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
        assert second.status_code == 201 and second.content == b"x" * 1000
        assert second.headers["Idempotent-Replayed"] == "true"
        big, gone = post_twice(api, "/responses/sized", {"n": 1001})
    assert big.status_code == 201 and len(big.content) == 1001
    assert gone.status_code == 410 and gone.json()["original_status"] == 201
    assert gone.headers["Location"] == "/things/1"
    assert gone.headers["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 2
