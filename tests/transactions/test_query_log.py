"""Django's query log (``connection.queries``, ``CaptureQueriesContext``, the
``django.db.backends`` logger) of an idempotent view: every entry is a statement's SQL."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_every_logged_query_of_a_keyed_view_with_blocks_is_sql():
    """With query logging on (``DEBUG``, ``assertNumQueries``, ``CaptureQueriesContext``)
    every entry of a keyed request, the view's savepoints included, is a statement's
    SQL: none shows up as a query whose SQL is ``None``."""
    token = TokenFactory(user__username="debug-log")
    with CaptureQueriesContext(connection) as captured:
        response = token_client(token.key).post(
            "/tx/nested-blocks", {}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4())
        )
    assert response.status_code == 201, response.content
    sqls = [query["sql"] for query in captured.captured_queries]
    assert all(isinstance(sql, str) for sql in sqls), sqls
    assert any(sql.startswith("SAVEPOINT") for sql in sqls), sqls
