from __future__ import annotations

import pytest

from tests.support.testapp.models import Widget

pytestmark = pytest.mark.django_db


def test_first_then_replay(api, key):
    first = api.post("/widgets", {"name": "a", "size": 1}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201, first.content
    again = api.post("/widgets", {"size": 1, "name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert Widget.objects.count() == 1
