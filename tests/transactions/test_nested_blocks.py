"""A view's nested ``atomic()`` blocks: what one rolled back to its savepoint is the
view's own business; the outer writes commit with the record, on PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


URLS = pytest.mark.urls("tests.support.response_views")


def _twice(api: Any, url: str, data: Any = None) -> tuple[Any, Any]:
    key = str(uuid.uuid4())
    first = api.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    second = api.post(url, data or {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    return first, second


@URLS
def test_a_caught_integrity_error_in_a_nested_block_keeps_the_outer_writes(api: Any) -> None:
    """docs/robustness.md: only the view's own outcome counts; a nested atomic() that
    rolled back to its savepoint leaves the outer writes, which commit with the record."""
    first, second = _twice(api, "/responses/caught-integrity")
    assert first.status_code == 201, first.content
    assert second.status_code == 201 and second.headers.get("Idempotent-Replayed") == "true"
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["after-caught", "kept"]
