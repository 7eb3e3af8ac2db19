"""W012 and W013: the days ahead of the partitioned record table run short, or records
wait in its default partition (docs/checks.md); and the gauges behind them
(``metrics.partition_stats``)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from django_idempotency import metrics, retention, store, testing
from django_idempotency.checks.databases import check_record_partitions
from django_idempotency.retention import partitions
from django_idempotency.store.catalog import is_partitioned
from django_idempotency.store.schema.tables import days_needed

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400.0


def ids() -> list[str]:
    return [m.id for m in check_record_partitions(databases=["default"])]


def claim_far_ahead() -> store.Claim:
    """A claim whose day has no partition: it lands in the default partition."""
    with testing.travel(5000 * DAY):
        won = store.claim(
            store.Scope("auth.user:9", "POST /far", str(uuid.uuid4())),
            "e" * 64,
            lease=30,
            retention=60,
        )
    assert isinstance(won, store.Claim)
    return won


def test_no_warning_when_the_sweeper_keeps_the_days_ahead_and_the_default_empty():
    retention.sweep()
    assert ids() == []
    stats = metrics.partition_stats()
    if is_partitioned(connection):
        assert stats is not None and stats.days_ahead >= days_needed() + 1
        assert stats.default_rows == 0
    else:
        assert stats is None  # nothing to report: the table is not partitioned


def test_the_check_reads_only_the_databases_it_is_asked_about():
    retention.sweep()
    assert check_record_partitions(databases=None) == []


@pytest.mark.postgres
def test_w012_when_a_day_ahead_is_missing():
    if not is_partitioned(connection):
        pytest.skip("partitioned table only")
    retention.sweep()
    tomorrow = retention.sweep(dry_run=True).now.date()
    missing = [p for p in partitions.list_partitions(connection) if p.day > tomorrow]
    partitions.drop(connection, missing[0], lock_timeout=10)  # the sweeper fell behind
    try:
        assert metrics.partition_stats().days_ahead < days_needed() + 1
        (warning,) = check_record_partitions(databases=["default"])
        assert warning.id == "django_idempotency.W012"
        assert "land in the default partition" in warning.msg
        assert "idempotency_sweep" in warning.hint
    finally:
        retention.sweep()
    assert ids() == []


@pytest.mark.postgres
def test_w013_when_records_wait_in_the_default_partition():
    if not is_partitioned(connection):
        pytest.skip("partitioned table only")
    retention.sweep()
    won = claim_far_ahead()
    try:
        assert metrics.partition_stats().default_rows == 1
        (warning,) = check_record_partitions(databases=["default"])
        assert warning.id == "django_idempotency.W013"
        assert warning.msg.startswith("1 record(s) wait in the default partition")
    finally:
        store.release(won)
    assert ids() == []
