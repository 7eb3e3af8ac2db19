"""Test clients authenticated as a principal."""

from __future__ import annotations

import uuid
from typing import Any

from rest_framework.test import APIClient


def client_for(token: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def post_twice(api: Any, url: str, data: Any = None) -> tuple[Any, Any]:
    """POST ``data`` to ``url`` twice with one new idempotency key: (first, retry)."""
    key = str(uuid.uuid4())
    first = api.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    second = api.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    return first, second
