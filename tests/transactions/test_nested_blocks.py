"""A view's nested ``atomic()`` blocks: inside the app's transaction each is a savepoint.
What one rolled back to its savepoint stays rolled back; the rest of the view's writes
commit with the record."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction

from django_idempotency.models import IdempotencyRecord
from tests.support.clients import post_twice
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db(transaction=True)]


URLS = pytest.mark.urls("tests.support.response_views")


@pytest.mark.postgres
@URLS
def test_a_caught_integrity_error_in_a_nested_block_keeps_the_outer_writes(api: Any) -> None:
    """docs/robustness.md: only the view's own outcome counts; a nested atomic() that
    rolled back to its savepoint leaves the outer writes, which commit with the record."""
    first, second = post_twice(api, "/responses/caught-integrity")
    assert first.status_code == 201, first.content
    assert second.status_code == 201 and second.headers.get("Idempotent-Replayed") == "true"
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["after-caught", "kept"]


def test_a_views_blocks_commit_with_the_completion_and_a_rolled_back_one_stays_rolled_back():
    """A block that commits, one that fails and is caught, a write between and two
    nested blocks right before the response: the first, the write between and the last
    commit with the completed record, the rolled-back block's row never does, and the
    connection is back in autocommit with no transaction left open."""
    token = TokenFactory(user__username=f"blocks-{uuid.uuid4().hex[:8]}")
    key = str(uuid.uuid4())
    client = token_client(token.key)
    response = client.post("/tx/nested-blocks", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201, response.content
    names = sorted(Widget.objects.values_list("name", flat=True))
    assert names == ["between", "first", "last"]
    assert IdempotencyRecord.objects.get().state == "completed"
    assert transaction.get_autocommit()  # no transaction left open
    replay = client.post("/tx/nested-blocks", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json() == response.json()
    assert Widget.objects.count() == 3
