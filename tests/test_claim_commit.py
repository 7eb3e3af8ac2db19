"""The first execution's two cheapest savings, and what guards them (docs/benchmarks.md).

* The claim commits without waiting for the WAL flush when it is its own transaction
  (``synchronous_commit = off`` for that transaction only), never inside a caller's
  transaction, whose writes must stay durable at their COMMIT.
* The completion names the record's partition key (``sweep_after``, returned by the
  partitioned claim), so PostgreSQL touches one day partition; the key is part of the
  fence.
"""

from __future__ import annotations

import dataclasses
import re
import uuid

import pytest
from django.db import connection, transaction

from django_idempotency import store
from django_idempotency.models import IdempotencyRecord

pytestmark = pytest.mark.postgres

FP = "f" * 64
RESPONSE = store.StoredResponse(201, [("Content-Type", "application/json")], b"{}")


def scope() -> store.Scope:
    return store.Scope("commit-tests", "POST /orders", str(uuid.uuid4()))


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def claim(sc: store.Scope) -> store.Claim:
    won = store.claim(sc, FP, lease=30, retention=3600)
    assert isinstance(won, store.Claim)
    return won


def test_an_own_transaction_claim_leaves_the_session_synchronous(record_table):
    won = claim(scope())
    assert synchronous_commit() == "on"  # SET LOCAL: gone with the claim's transaction
    with transaction.atomic():
        store.complete(won, RESPONSE)
        assert synchronous_commit() == "on"  # the view's COMMIT waits for the flush


def test_a_claim_inside_a_callers_transaction_never_makes_it_asynchronous(record_table):
    with transaction.atomic():
        claim(scope())
        assert synchronous_commit() == "on"


def test_the_claim_statement_commits_asynchronously_when_asked(record_table, monkeypatch):
    """What the statement does with ``async_commit``, seen inside an explicit block."""
    seen: list[str] = []
    real = store._pg_params

    def in_block(sc: store.Scope, **extra: object) -> dict[str, object]:
        return real(sc, **{**extra, "async_commit": True})

    monkeypatch.setattr(store, "_pg_params", in_block)
    with transaction.atomic():
        claim(scope())
        seen.append(synchronous_commit())
    assert seen == ["off"]


def test_the_completion_is_fenced_by_the_partition_key_too(record_table):
    won = claim(scope())
    row = IdempotencyRecord.objects.get(pk=won.record_id)
    if record_table == "partitioned":
        assert won.sweep_after == row.sweep_after
        moved = dataclasses.replace(won, sweep_after=row.sweep_after.replace(year=2000))
        with pytest.raises(store.LeaseLost), transaction.atomic():
            store.complete(moved, RESPONSE)
    else:
        assert won.sweep_after is None  # a plain table has one heap: nothing to prune
    with transaction.atomic():
        store.complete(won, RESPONSE)
    assert IdempotencyRecord.objects.get(pk=won.record_id).state == "completed"


def test_the_pruned_completion_plans_one_partition(record_table):
    if record_table != "partitioned":
        pytest.skip("partitions only")
    won = claim(scope())
    from django_idempotency._pg import PG_COMPLETE_PRUNED_SQL

    params = {
        "status": 201,
        "headers": "[]",
        "body": b"",
        "id": won.record_id,
        "token": won.owner_token,
        "grace": 1.0,
        "clock_offset": 0.0,
        "sweep_after": won.sweep_after,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + PG_COMPLETE_PRUNED_SQL, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    scanned = set(re.findall(r"django_idempotency_record_p\d{8}\b", plan))
    assert len(scanned) == 1, plan  # without the key: every day partition
