"""Whose keys a Ninja operation's keys are: the user a credential stands for (docs/ninja.md).

A client that refreshes its access token keeps its keys: the same key with the new
token is a replay, never a second execution. A credential that names no user is
refused unless the operation chooses ``credential_principal``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from ninja.testing import TestClient
from rest_framework.authtoken.models import Token

from django_idempotency.contrib import ninja as contrib_ninja
from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.keys import HEADER
from tests.support.ninja_api import api
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db


def refreshed(token: Token) -> Token:
    """A new access token for the same user; the old one is revoked."""
    user = token.user
    token.delete()
    return Token.objects.create(user=user)


@pytest.mark.parametrize(
    ("path", "auth"),
    [("/widgets", "the user"), ("/token-rows", "the token row")],
)
def test_a_refreshed_access_token_replays_the_operation_of_the_old_one(
    path: str, auth: str, alice: Any
) -> None:
    client = TestClient(api)
    shared = str(uuid.uuid4())
    body = {"name": "transfer"}
    first = client.post(
        path, json=body, headers={"Authorization": f"Bearer {alice.key}", HEADER: shared}
    )
    assert first.status_code == 201, (auth, first.content)
    token = refreshed(alice)
    retry = client.post(
        path, json=body, headers={"Authorization": f"Bearer {token.key}", HEADER: shared}
    )
    assert retry.status_code == 201, (auth, retry.content)
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Widget.objects.filter(name="transfer").count() == 1
    (principal,) = set(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert principal == f"auth.user:{token.user.pk}"


def test_a_credential_that_names_no_user_is_refused_and_the_operation_logged_once(
    alice: Any, caplog: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(contrib_ninja, "_WARNED", set())  # as in a fresh process
    client = TestClient(api)
    headers = {"Authorization": f"Bearer {alice.key}"}
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        for _ in range(2):
            refused = client.post(
                "/bare-token", json={"name": "a"}, headers={**headers, HEADER: str(uuid.uuid4())}
            )
            assert refused.status_code == 403
            assert refused.json()["type"].endswith("no-principal")
    assert Widget.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0
    logged = [
        r
        for r in caplog.records
        if r.name == "django_idempotency" and "names no user" in r.getMessage()
    ]
    (line,) = logged  # once per operation
    assert "tests.support.ninja_api.with_bare_token" in line.getMessage()
    assert "credential_principal" in line.getMessage()
