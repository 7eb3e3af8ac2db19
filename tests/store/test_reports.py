"""The store's read-only reports: a statement bounded in time (the keys-minted audit's).

The outbox's counts (``reports.outbox_stats``) are tested through ``metrics.outbox_stats``
in tests/test_metrics.py; a bounded statement cancelled by its limit through the audit
command in tests/test_audit_command.py.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction

from django_idempotency import store
from django_idempotency.store import reports

pytestmark = pytest.mark.django_db

SELECT = "SELECT key FROM django_idempotency_record WHERE principal = %s ORDER BY key"


def claimed(principal: str, key: str) -> None:
    scope = store.Scope(principal, "POST /jobs", key)
    assert isinstance(store.claim(scope, "f" * 64, lease=30.0, retention=3600.0), store.Claim)


def test_a_bounded_read_returns_the_statements_rows():
    """Within its limit, the statement's rows come back as tuples, in its order."""
    claimed("auth.user:7", "b")
    claimed("auth.user:7", "a")
    claimed("auth.user:8", "c")
    assert reports.bounded_rows("default", SELECT, ["auth.user:7"], timeout=5.0) == [
        ("a",),
        ("b",),
    ]


@pytest.mark.postgres
def test_a_bounded_read_leaves_the_callers_statement_timeout_as_it_was():
    """Inside a caller's transaction that set its own ``statement_timeout``, the read
    runs under its limit and the caller's setting is in force again after it."""
    key = str(uuid.uuid4())
    claimed("auth.user:7", key)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('statement_timeout', '7s', true)")
        during = reports.bounded_rows(
            "default", "SELECT current_setting('statement_timeout')", [], timeout=0.25
        )
        assert during == [("250ms",)]
        assert reports.bounded_rows("default", SELECT, ["auth.user:7"], timeout=5.0) == [(key,)]
        cursor.execute("SELECT current_setting('statement_timeout')")
        assert cursor.fetchone()[0] == "7s"
