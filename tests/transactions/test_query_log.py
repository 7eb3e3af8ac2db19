"""Django's query log (``connection.queries``, ``CaptureQueriesContext``, the
``django.db.backends`` logger) of an idempotent view: every entry is a statement's SQL,
on PostgreSQL; releases held back never show up as queries without SQL."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


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
