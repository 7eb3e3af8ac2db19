"""A view's nested ``atomic()`` blocks: what one rolled back to its savepoint is the
view's own business; the outer writes commit with the record, on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.clients import post_twice
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


URLS = pytest.mark.urls("tests.support.response_views")


@URLS
def test_a_caught_integrity_error_in_a_nested_block_keeps_the_outer_writes(api: Any) -> None:
    """docs/robustness.md: only the view's own outcome counts; a nested atomic() that
    rolled back to its savepoint leaves the outer writes, which commit with the record."""
    first, second = post_twice(api, "/responses/caught-integrity")
    assert first.status_code == 201, first.content
    assert second.status_code == 201 and second.headers.get("Idempotent-Replayed") == "true"
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["after-caught", "kept"]
