"""A large stored body is bound on the server as a binary parameter (PostgreSQL).

Django's default client-side binding would escape it into the query's text (several
times the body in memory); from ``BOUND_BODY_BYTES`` on, the completion binds it on the
server instead. The completion stays fenced, commits with the view's writes (by the
view's block), is seen by execute wrappers, and never leaves a prepared statement a
pooler could lose.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_idempotency import exceptions, store, transactions
from django_idempotency.models import IdempotencyRecord
from django_idempotency.store import presence
from django_idempotency.store.records.postgresql import BOUND_BODY_BYTES
from tests.support.factories import UserFactory
from tests.support.faults import admin_connection, committed_elsewhere
from tests.support.testapp.models import Widget
from tests.support.testapp.views import LARGE_BODY

pytestmark = [pytest.mark.postgres]

FP = "f" * 64
BIG = store.StoredResponse(201, [("Content-Type", "application/octet-stream")], LARGE_BODY)


def claim() -> store.Claim:
    won = store.claim(
        store.Scope("large-body", "POST /blobs", str(uuid.uuid4())), FP, lease=30, retention=3600
    )
    assert isinstance(won, store.Claim)
    return won


@pytest.mark.pooled
def test_the_test_body_is_large_enough_to_be_bound():
    assert len(LARGE_BODY) >= BOUND_BODY_BYTES


@pytest.mark.pooled
def test_a_large_body_commits_with_the_views_writes_and_replays_exactly(
    record_table, statements, commands
):
    client = Client()
    client.force_login(UserFactory(username=f"large-{uuid.uuid4().hex[:6]}"))
    key = str(uuid.uuid4())
    statements.clear()
    commands.clear()
    first = client.post("/large-body", {}, HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201 and first.content == LARGE_BODY
    completion = [sql for sql in statements if "django_idempotency_complete(" in sql]
    assert len(completion) == 1 and "COMMIT" not in completion[0]  # seen by wrappers
    assert commands[-1] == b"COMMIT"  # the view's block commits it
    record = IdempotencyRecord.objects.get(key=key)
    assert committed_elsewhere(
        "SELECT length(response_body) FROM django_idempotency_record WHERE id = %s", record.pk
    ) == len(LARGE_BODY)
    assert committed_elsewhere("SELECT count(*) FROM testapp_widget WHERE name = 'large'") == 1
    again = client.post("/large-body", {}, HTTP_IDEMPOTENCY_KEY=key)
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == LARGE_BODY and again["Location"] == first["Location"]
    assert Widget.objects.filter(name="large").count() == 1


@pytest.mark.pooled
def test_a_fenced_large_completion_rolls_the_views_writes_back(record_table):
    won = claim()
    stolen = dataclasses.replace(won, owner_token=uuid.uuid4())  # as if taken over
    with pytest.raises(exceptions.LeaseLost), transactions.atomic("default"):
        Widget.objects.create(name="must-not-commit")
        store.complete(stolen, BIG)
    assert committed_elsewhere("SELECT count(*) FROM testapp_widget") == 0
    assert IdempotencyRecord.objects.get(pk=won.record_id).state == "claimed"
    with transactions.atomic("default"):  # its owner completes it; the block commits
        store.complete(won, BIG)
    assert committed_elsewhere(
        "SELECT state FROM django_idempotency_record WHERE id = %s", won.record_id
    ) == ("completed")
    assert bytes(IdempotencyRecord.objects.get(pk=won.record_id).response_body) == LARGE_BODY


def test_a_large_completion_releases_the_owners_presence_lock(record_table):
    """On a direct connection (behind a transaction pooler there is no owner presence)."""
    won = claim()
    assert won.present and presence.holds(won)  # a direct connection holds it
    with transactions.atomic("default"):
        store.complete(won, BIG)
    assert not presence.holds(won)
    with admin_connection() as other:
        held = other.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
            [connection.connection.info.backend_pid],
        ).fetchone()[0]
    assert held == 0


@pytest.mark.pooled
def test_large_completions_leave_no_prepared_statement(record_table):
    """Even where a project asks psycopg to prepare (``OPTIONS["prepare_threshold"]``)."""
    connection.ensure_connection()
    raw = connection.connection
    before, raw.prepare_threshold = raw.prepare_threshold, 0  # prepare at first use
    try:
        for _ in range(3):
            won = claim()
            with transactions.atomic("default"):
                store.complete(won, BIG)
    finally:
        raw.prepare_threshold = before
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0


@pytest.mark.pooled
def test_a_large_completion_appears_in_djangos_query_log(record_table):
    """Django logs every query with ``DEBUG`` (and ``assertNumQueries``,
    ``CaptureQueriesContext``): the completion of a body bound on the server is one."""
    won = claim()
    with CaptureQueriesContext(connection) as log, transactions.atomic("default"):
        store.complete(won, BIG)
    completions = [
        q["sql"] for q in log.captured_queries if "django_idempotency_complete(" in q["sql"]
    ]
    assert len(completions) == 1
