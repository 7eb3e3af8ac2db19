"""Test clients authenticated as a principal."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient


def client_for(token: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client
