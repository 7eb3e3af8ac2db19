"""The claim's asynchronous commit (``synchronous_commit = off`` for the claim's own
transaction only) never reaches a caller's transaction or the session, on PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from django.db import connections, transaction

from django_idempotency import store
from tests.support.concurrency import Runner
from tests.support.faults import direct_presence  # noqa: F401  (the fixture)
from tests.support.testapp.models import Widget
from tests.support.two_database_app import (
    FP,
    PRINCIPAL,
    synchronous_commit,
)

pytestmark = [
    pytest.mark.usefixtures("direct_presence"),
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
    pytest.mark.urls("tests.support.two_database_app"),
]


def test_a_claim_in_a_callers_manual_transaction_leaves_it_synchronous(record_table: str) -> None:
    """With Django's manual transaction management (``transaction.set_autocommit(False)``, or
    ``"AUTOCOMMIT": False`` in DATABASES) the connection is inside the caller's
    transaction but not in an atomic block. The claim is not in a transaction of its own
    there, so it does not turn ``synchronous_commit`` off: the caller's own writes,
    committed later, wait for the WAL flush (``on``)."""
    transaction.set_autocommit(False)
    try:
        Widget.objects.create(name="the caller's durable write")
        won = store.claim(
            store.Scope(PRINCIPAL, "POST /manual", str(uuid.uuid4())), FP, lease=30,
            retention=3600,
        )  # fmt: skip
        assert isinstance(won, store.Claim)
        setting = synchronous_commit()
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert setting == "on", "the caller's transaction was made asynchronous by the claim"


def test_the_session_commits_synchronously_after_any_claim_outcome(
    record_table: str,
) -> None:
    """After an own-transaction claim that wins, one that finds the record in flight, one that
    replays, and one that takes a dead owner's claim over, the next statements of the
    same connection run with ``synchronous_commit = on``, and a caller's ``atomic()``
    after them commits synchronously."""
    sc = store.Scope(PRINCIPAL, "POST /leak", str(uuid.uuid4()))
    won = store.claim(sc, FP, lease=30, retention=3600)
    assert isinstance(won, store.Claim)
    assert synchronous_commit() == "on"

    def duplicate() -> str:
        try:
            found = store.claim(sc, FP, lease=30, retention=3600)
            assert isinstance(found, store.Existing)
            return synchronous_commit()
        finally:
            connections.close_all()

    runner = Runner()
    runner.start(duplicate)
    assert runner.join() == ["on"]
    with transaction.atomic():
        store.complete(won, store.StoredResponse(201, [], b"{}"))
    replay = store.claim(sc, FP, lease=30, retention=3600)
    assert isinstance(replay, store.Existing) and replay.response is not None
    assert synchronous_commit() == "on"
    with transaction.atomic():
        Widget.objects.create(name="x")
        assert synchronous_commit() == "on"
