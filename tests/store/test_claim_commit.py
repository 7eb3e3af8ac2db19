"""The transaction the completion commits in (docs/benchmarks.md).

The completion is a fenced statement inside the view's transaction, which the app's
block then commits: a lost lease rolls the view's writes back, and a deferred constraint
the view's writes violate at that ``COMMIT`` is the view's error.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from django.db import transaction

from django_idempotency import exceptions, store, transactions
from django_idempotency.models import IdempotencyRecord
from tests.support.concurrency import token_client
from tests.support.factories import TokenFactory
from tests.support.faults import committed_elsewhere
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.postgres, pytest.mark.pooled]

FP = "f" * 64
RESPONSE = store.StoredResponse(201, [("Content-Type", "application/json")], b"{}")


def scope() -> store.Scope:
    return store.Scope("commit-tests", "POST /orders", str(uuid.uuid4()))


def claim(sc: store.Scope) -> store.Claim:
    won = store.claim(sc, FP, lease=30, retention=3600)
    assert isinstance(won, store.Claim)
    return won


# --- The completion and the view's COMMIT -------------------------------------------


def test_the_completion_commits_with_the_views_writes(record_table, commands, statements):
    """One transaction: psycopg's ``BEGIN``, the view's writes, the fenced completion,
    then the block's ``COMMIT``; both are visible to another session afterwards."""
    token = TokenFactory(user__username="commit-with")
    commands.clear()
    statements.clear()
    response = token_client(token.key).post(
        "/widgets", {"name": "one-trip"}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4())
    )
    assert response.status_code == 201, response.content
    completion = [sql for sql in statements if "django_idempotency_complete(" in sql]
    assert len(completion) == 1 and "COMMIT" not in completion[0]
    assert commands == [b"BEGIN", b"COMMIT"]  # the view's transaction, Django's COMMIT
    widget = response.json()["id"]
    assert committed_elsewhere("SELECT name FROM testapp_widget WHERE id = %s", widget) == (
        "one-trip"
    )
    state = committed_elsewhere("SELECT state FROM django_idempotency_record")
    assert state == "completed"


def test_a_lease_lost_at_the_completion_commits_nothing(record_table):
    won = claim(scope())
    stolen = dataclasses.replace(won, owner_token=uuid.uuid4())  # as if taken over
    with pytest.raises(exceptions.LeaseLost), transactions.atomic("default"):
        Widget.objects.create(name="must-not-commit")
        store.complete(stolen, RESPONSE)
    assert committed_elsewhere("SELECT count(*) FROM testapp_widget") == 0
    assert IdempotencyRecord.objects.get(pk=won.record_id).state == "claimed"
    with transactions.atomic("default"):  # its rightful owner still completes it
        store.complete(won, RESPONSE)
    assert (
        committed_elsewhere(
            "SELECT state FROM django_idempotency_record WHERE id = %s", won.record_id
        )
        == "completed"
    )


def test_the_completion_function_raises_when_fenced_off(record_table):
    won = claim(scope())
    for stale in (
        dataclasses.replace(won, owner_token=uuid.uuid4()),  # taken over
        dataclasses.replace(won, record_id=won.record_id + 10_000),  # gone
    ):
        with pytest.raises(exceptions.LeaseLost) as raised, transaction.atomic():
            store.complete(stale, RESPONSE)
        assert getattr(raised.value.__cause__.__cause__, "sqlstate", None) == "DIF01"
        assert f"record {stale.record_id} was fenced off" in str(raised.value.__cause__)
    assert IdempotencyRecord.objects.get(pk=won.record_id).state == "claimed"
    with transaction.atomic():
        store.complete(won, RESPONSE)
    row = IdempotencyRecord.objects.get(pk=won.record_id)
    assert (row.state, row.response_status, bytes(row.response_body)) == ("completed", 201, b"{}")


def test_a_completion_late_in_a_short_window_pushes_the_window_past_its_lease(record_table):
    """A window shorter than the lease: the completion keeps the response replayable for
    at least the lease after it commits; a stale owner's completion is fenced off."""
    with transaction.atomic():
        won = store.claim(scope(), FP, lease=30, retention=1)
        assert isinstance(won, store.Claim)
        window = IdempotencyRecord.objects.get(pk=won.record_id).expires_at
        stale = dataclasses.replace(won, owner_token=uuid.uuid4())
        with pytest.raises(exceptions.LeaseLost), transaction.atomic():
            store.complete(stale, RESPONSE)
        store.complete(won, RESPONSE)
        row = IdempotencyRecord.objects.get(pk=won.record_id)
        assert row.state == "completed" and row.expires_at > window


def test_a_deferred_constraint_refused_at_the_commit_after_the_completion_is_the_views_error(
    record_table, statements
):
    """The block's COMMIT after the completion raises the view's IntegrityError (every
    foreign key Django creates on PostgreSQL is DEFERRABLE INITIALLY DEFERRED), and
    neither the view's writes nor the completion commit."""
    from django.db import IntegrityError

    token = TokenFactory(user__username="deferred-commit")
    client = token_client(token.key)
    client.raise_request_exception = True
    key = str(uuid.uuid4())
    with pytest.raises(IntegrityError):
        client.post("/tx/deferred", {}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert any("django_idempotency_complete(" in sql for sql in statements)
    assert committed_elsewhere("SELECT count(*) FROM testapp_widget") == 0
    assert committed_elsewhere("SELECT count(*) FROM django_idempotency_record") == 0
