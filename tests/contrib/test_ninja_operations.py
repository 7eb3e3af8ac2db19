"""What a Ninja operation declares for itself: its ``principal=`` and the headers it
sets on Ninja's temporal ``response`` (docs/ninja.md)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from ninja.testing import TestClient

from django_idempotency.models import IdempotencyRecord
from django_idempotency.protocol.keys import HEADER
from tests.support.ninja_api import api
from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db


def test_an_operations_own_principal_scopes_its_keys(alice: Any, bob: Any) -> None:
    client = TestClient(api)
    shared = str(uuid.uuid4())
    body = {"name": "team"}
    first = client.post(
        "/team-widgets",
        json=body,
        headers={"Authorization": f"Bearer {alice.key}", "X-Team": "ops", HEADER: shared},
    )
    assert first.status_code == 201, first.content
    teammate = client.post(
        "/team-widgets",
        json=body,
        headers={"Authorization": f"Bearer {bob.key}", "X-Team": "ops", HEADER: shared},
    )
    assert teammate.status_code == 201
    assert teammate["Idempotent-Replayed"] == "true"  # the team's key, not bob's
    assert teammate.content == first.content
    other_team = client.post(
        "/team-widgets",
        json=body,
        headers={"Authorization": f"Bearer {alice.key}", "X-Team": "dev", HEADER: shared},
    )
    assert not other_team.has_header("Idempotent-Replayed")
    assert Widget.objects.count() == 2
    principals = set(IdempotencyRecord.objects.values_list("principal", flat=True))
    assert principals == {"team:ops", "team:dev"}


def test_headers_set_on_the_temporal_response_are_sent_and_replayed(alice: Any) -> None:
    client = TestClient(api)
    headers = {"Authorization": f"Bearer {alice.key}", HEADER: str(uuid.uuid4())}
    first = client.post("/labelled", json={"name": "l"}, headers=headers)
    assert first.status_code == 201, first.content
    widget = Widget.objects.get()
    assert first["X-Widget-Id"] == str(widget.pk)
    assert first.cookies["last_widget"].value == str(widget.pk)
    replay = client.post("/labelled", json={"name": "l"}, headers=headers)
    assert replay["Idempotent-Replayed"] == "true"
    assert replay["X-Widget-Id"] == str(widget.pk)
    # Set-Cookie belongs to one exchange: never stored, never replayed (docs/protocol.md)
    assert "last_widget" not in replay.cookies
    assert Widget.objects.count() == 1
