"""contrib/prometheus.py: counters and gauges in a real prometheus_client registry."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import prometheus_client
import pytest
from django.db import connection, transaction

from django_idempotency import outbox
from django_idempotency.contrib import prometheus

pytestmark = pytest.mark.django_db


@pytest.fixture
def registry() -> Iterator[Any]:
    registry = prometheus_client.CollectorRegistry()
    prometheus.install(registry)
    yield registry
    prometheus.uninstall(registry)


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


def test_requests_increment_counters(registry, api, key):
    for body in ({"name": "a"}, {"name": "a"}, {"name": "b"}):
        api.post("/widgets", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    api.post("/outcome", {"status": 503}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    endpoint = "POST /widgets"
    assert value(registry, "django_idempotency_claims_total", endpoint=endpoint) == 1
    assert (
        value(registry, "django_idempotency_completions_total", endpoint=endpoint, status="201")
        == 1
    )
    assert value(registry, "django_idempotency_replays_total", endpoint=endpoint, status="201") == 1
    assert value(registry, "django_idempotency_key_reuses_total", endpoint=endpoint) == 1
    assert (
        value(
            registry,
            "django_idempotency_releases_total",
            endpoint="POST /outcome",
            status="503",
        )
        == 1
    )


def test_exposition_has_help_and_gauges(registry):
    text = prometheus_client.generate_latest(registry).decode()
    assert "# HELP django_idempotency_fenced_rollbacks_total" in text
    assert "# TYPE django_idempotency_in_flight_conflicts_total counter" in text
    assert "# TYPE django_idempotency_outbox_delivery_lag_seconds histogram" in text
    assert "django_idempotency_outbox_lag_seconds 0.0" in text
    assert "django_idempotency_outbox_dead_messages 0.0" in text


def test_outbox_gauges_read_the_table_at_scrape_time(registry):
    with transaction.atomic():
        for i in range(3):
            outbox.enqueue("prom.topic", {"n": i})
    assert value(registry, "django_idempotency_outbox_pending_messages") == 3
    assert value(registry, "django_idempotency_outbox_due_messages") == 3


class _Rollback(Exception):
    pass


def test_a_failing_database_skips_the_gauges(registry, caplog):
    table = connection.ops.quote_name("django_idempotency_outbox")
    with pytest.raises(_Rollback), transaction.atomic():  # DDL is transactional on both
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RENAME TO django_idempotency_outbox_gone")
        with caplog.at_level(logging.WARNING, logger="django_idempotency.metrics"):
            text = prometheus_client.generate_latest(registry).decode()
        raise _Rollback
    assert "django_idempotency_outbox_lag_seconds" not in text
    assert "django_idempotency_claims_total" in text  # counters still exported
    assert any("outbox gauges skipped" in r.getMessage() for r in caplog.records)


def test_install_is_idempotent_and_uninstall_removes_everything(api):
    registry = prometheus_client.CollectorRegistry()
    sink = prometheus.install(registry, outbox=False)
    assert prometheus.install(registry) is sink
    api.post("/widgets", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    assert value(registry, "django_idempotency_claims_total", endpoint="POST /widgets") == 1
    prometheus.uninstall(registry)
    assert "django_idempotency" not in prometheus_client.generate_latest(registry).decode()
    api.post("/widgets", {"name": "b"}, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
    prometheus.uninstall(registry)  # twice is harmless


def test_registration_does_not_query_the_database(django_assert_num_queries):
    registry = prometheus_client.CollectorRegistry(auto_describe=True)
    with django_assert_num_queries(0):
        prometheus.install(registry)
    prometheus.uninstall(registry)


def test_partition_gauges_follow_the_partitioned_record_table(registry):
    """On PostgreSQL's day-partitioned record table the days ahead and the default
    partition's records are exported at each scrape; elsewhere no series is."""
    from django_idempotency.store.catalog import is_partitioned

    text = prometheus_client.generate_latest(registry).decode()
    if not is_partitioned(connection):  # described, no series
        assert registry.get_sample_value("django_idempotency_partition_days_ahead") is None
        return
    assert "# TYPE django_idempotency_partition_days_ahead gauge" in text
    assert value(registry, "django_idempotency_partition_days_ahead") >= 1
    assert value(registry, "django_idempotency_default_partition_rows") == 0
