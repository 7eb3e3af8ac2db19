"""``transaction.on_commit`` callbacks of an idempotent view: they run once, when the
view's transaction commits with its record; never on a replay, never for a released
status (5xx, 409, 429) and never for a fenced completion, on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from tests.support.clients import post_twice
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


URLS = pytest.mark.urls("tests.support.response_views")


@URLS
def test_on_commit_runs_once_and_never_on_replay(api: Any) -> None:
    """docs/faq.md (view transaction outcomes) / Django: on_commit callbacks run when the
    view's transaction commits, once; a replay runs nothing."""
    first, second = post_twice(api, "/responses/on-commit")
    assert first.status_code == 201 and second.status_code == 201
    assert Widget.objects.filter(name="on-commit").count() == 1
    assert Widget.objects.filter(name="body").count() == 1


@URLS
@pytest.mark.parametrize("code", [503, 409, 429])
def test_on_commit_never_runs_for_a_released_status(api: Any, code: int) -> None:
    """docs/protocol.md "Stored or released": a returned 5xx/409/429 rolls the view's
    writes back; its on_commit callbacks must not run, and a retry runs the view again."""
    first, second = post_twice(api, "/responses/on-commit", {"status": code})
    assert first.status_code == code and second.status_code == code
    assert "Idempotent-Replayed" not in second.headers
    assert Widget.objects.count() == 0


def test_on_commit_callbacks_run_once_after_the_carried_commit_and_never_when_fenced():
    """The COMMIT goes with the completion; Django's block exit still runs the view's
    ``transaction.on_commit`` callbacks, once; a fenced completion runs none."""
    from tests.support.faults import admin_connection
    from tests.support.testapp.gates import HOOKS

    ran: list[object] = []

    def register(request: object) -> None:
        transaction.on_commit(lambda: ran.append(Widget.objects.count()))

    def register_then_fence(request: object) -> None:
        transaction.on_commit(lambda: ran.append("fenced"))
        with admin_connection() as admin:  # a takeover, committed while the view runs
            admin.execute(
                "UPDATE django_idempotency_record SET owner_token = gen_random_uuid() "
                "WHERE state = 'claimed'"
            )

    client = token_client(TokenFactory(user__username="on-commit").key)
    HOOKS["during_view"] = register
    first = client.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201, first.content
    assert ran == [1]  # after the COMMIT: the committed widget is visible
    HOOKS["during_view"] = register_then_fence
    fenced = client.post("/widgets", {"name": "b"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert fenced.status_code == 409, fenced.content
    assert ran == [1]
    assert list(Widget.objects.values_list("name", flat=True)) == ["a"]
