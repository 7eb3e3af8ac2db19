"""Review s19: the completion that carries the COMMIT and the held savepoint releases."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction

from django_idempotency.models import IdempotencyRecord
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_an_idempotent_view_called_inside_another_runs_both_once():
    """docs/faq.md: an idempotent view called from inside another one's transaction is
    supported (the app's own blocks are not outer blocks). The inner view has two blocks
    one after the other; the outer one runs a statement after it returns."""
    token = TokenFactory(user__username="nested-views")
    client = token_client(token.key)
    client.raise_request_exception = False
    response = client.post(
        "/review/outer",
        {"inner_key": str(uuid.uuid4())},
        format="json",
        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
    )
    assert response.status_code == 201, response.content
    assert response.json() == {"inner": 201, "count": 2}
    assert sorted(Widget.objects.values_list("name", flat=True)) == ["inner-1", "inner-2"]
    assert sorted(IdempotencyRecord.objects.values_list("state", flat=True)) == [
        "completed",
        "completed",
    ]


def test_held_releases_are_not_logged_as_statements_without_sql():
    """With DEBUG query logging (``connection.queries``, ``assertNumQueries``, the
    ``django.db.backends`` logger) every entry is a statement's SQL. A release that is
    held back must not show up as a query whose SQL is ``None``."""
    from django.test.utils import CaptureQueriesContext

    token = TokenFactory(user__username="debug-log")
    with CaptureQueriesContext(connection) as captured:
        response = token_client(token.key).post(
            "/tx/nested-blocks", {}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4())
        )
    assert response.status_code == 201, response.content
    sqls = [query["sql"] for query in captured.captured_queries]
    assert all(isinstance(sql, str) for sql in sqls), sqls


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
