"""Failure signatures a correct server cannot prevent, as operators see them: the
execution time of each execution against its lease, and the age of each replayed record
against its retention window (docs/observability.md#failure-signatures)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings

from django_idempotency import inbox, metrics, signals
from django_idempotency.metrics import InMemoryMetrics
from django_idempotency.testing import travel

pytestmark = pytest.mark.django_db

WIDGETS = "POST /widgets"
DAY = 24 * 3600.0


@pytest.fixture
def sink() -> Iterator[InMemoryMetrics]:
    recorded = InMemoryMetrics()
    metrics.connect(recorded)
    yield recorded
    metrics.disconnect(recorded)


def post(api: Any, path: str, key: str, data: dict[str, Any] | None = None) -> Any:
    return api.post(path, data or {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def observed(sink: InMemoryMetrics, metric: metrics.Metric) -> list[tuple[float, dict[str, str]]]:
    return sink.observations.get(metric.name, [])


def test_each_execution_observes_its_duration_under_its_endpoint(sink, api, key):
    assert post(api, "/widgets", key).status_code == 201
    assert post(api, "/widgets", key).status_code == 201  # a replay runs nothing
    assert post(api, "/outcome", str(uuid.uuid4()), {"status": 503}).status_code == 503
    durations = observed(sink, metrics.EXECUTION_TIME)
    assert sorted(labels["endpoint"] for _, labels in durations) == ["POST /outcome", WIDGETS]
    assert all(value >= 0 for value, _ in durations)


def test_an_execution_within_its_lease_is_not_near_it(sink, api, key, caplog):
    with caplog.at_level(logging.WARNING, logger="django_idempotency.events"):
        assert post(api, "/widgets", key).status_code == 201
    assert sink.value(metrics.NEAR_LEASE) == 0
    assert not [r for r in caplog.records if getattr(r, "event", "") == "near_lease"]


@override_settings(IDEMPOTENCY={"LEASE_WARNING_FRACTION": 1e-9})
def test_an_execution_past_the_warning_fraction_counts_and_logs_its_endpoint(
    sink, api, key, caplog
):
    with caplog.at_level(logging.WARNING, logger="django_idempotency.events"):
        assert post(api, "/widgets", key).status_code == 201
    assert sink.value(metrics.NEAR_LEASE, endpoint=WIDGETS) == 1
    (line,) = [r for r in caplog.records if getattr(r, "event", "") == "near_lease"]
    assert line.levelno == logging.WARNING
    assert WIDGETS in line.getMessage() and "lease" in line.getMessage()
    assert line.endpoint == WIDGETS and line.lease == 60.0


@override_settings(IDEMPOTENCY={"LEASE_WARNING_FRACTION": 1e-9})
def test_an_execution_that_extended_its_lease_is_not_near_it(sink, api, key):
    assert post(api, "/heartbeat", key).status_code == 201  # calls extend_lease(60)
    assert sink.value(metrics.NEAR_LEASE) == 0
    assert [labels for _, labels in observed(sink, metrics.EXECUTION_TIME)] == [
        {"endpoint": "POST /heartbeat"}
    ]


@pytest.mark.parametrize(
    ("duration", "lease", "renewed", "near"),
    [(8.0, 10.0, False, True), (7.9, 10.0, False, False), (9.0, 10.0, True, False)],
)
def test_near_lease_is_the_warning_fraction_of_a_lease_not_renewed(duration, lease, renewed, near):
    assert signals.execution_near_lease(duration, lease, renewed) is near


@override_settings(IDEMPOTENCY={"LEASE_WARNING_FRACTION": 1e-9})
def test_a_once_block_observes_its_duration_and_lease(sink):
    with inbox.once(str(uuid.uuid4()), principal="worker", endpoint="task billing.charge") as a:
        if not a.done:
            a.result = {"ok": True}
    assert [labels for _, labels in observed(sink, metrics.EXECUTION_TIME)] == [
        {"endpoint": "task billing.charge"}
    ]
    assert sink.value(metrics.NEAR_LEASE, endpoint="task billing.charge") == 1


def test_a_replay_observes_the_age_of_its_record(sink, api, key):
    assert post(api, "/widgets", key).status_code == 201
    with travel(3600):
        assert post(api, "/widgets", key).status_code == 201
    ((age, labels),) = observed(sink, metrics.REPLAY_AGE)
    assert labels == {"endpoint": WIDGETS}
    assert 3600 <= age < 3660
    assert sink.value(metrics.LATE_REPLAYS) == 0


def test_a_replay_near_the_end_of_the_retention_window_counts(sink, api, key):
    assert post(api, "/widgets", key).status_code == 201
    with travel(0.9 * DAY):  # RETENTION 24 h, RETENTION_WARNING_FRACTION 0.8
        assert post(api, "/widgets", key).status_code == 201
    assert sink.value(metrics.LATE_REPLAYS, endpoint=WIDGETS) == 1
    with override_settings(IDEMPOTENCY={"RETENTION_WARNING_FRACTION": 0.95}), travel(0.9 * DAY):
        assert post(api, "/widgets", key).status_code == 201
    assert sink.value(metrics.LATE_REPLAYS, endpoint=WIDGETS) == 1


def test_a_once_replay_observes_the_age_of_its_record(sink):
    key = str(uuid.uuid4())
    for _ in range(2):
        with inbox.once(key, principal="worker", endpoint="task billing.charge") as attempt:
            if not attempt.done:
                attempt.result = 1
    ((age, labels),) = observed(sink, metrics.REPLAY_AGE)
    assert labels == {"endpoint": "task billing.charge"} and 0 <= age < 60


def test_the_signature_metrics_carry_only_bounded_labels(sink, api, key):
    post(api, "/widgets", key)
    post(api, "/widgets", key)
    for metric in (metrics.EXECUTION_TIME, metrics.REPLAY_AGE):
        for _, labels in observed(sink, metric):
            assert set(labels) == {"endpoint"}
    for metric in (metrics.EXECUTION_TIME, metrics.NEAR_LEASE, metrics.REPLAY_AGE):
        assert metric.labels == ("endpoint",)


def test_a_phased_execution_is_observed_once_across_its_phases(sink, api, key):
    assert post(api, "/provision", key, {}).status_code == 201
    assert [labels for _, labels in observed(sink, metrics.EXECUTION_TIME)] == [
        {"endpoint": "POST /provision"}
    ]


@pytest.mark.urls("tests.support.ninja_api")
def test_a_ninja_operation_observes_its_execution_and_its_replays_age(sink, alice):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {alice.key}", "HTTP_IDEMPOTENCY_KEY": "k-ninja-1"}
    for _ in range(2):
        response = Client().post(
            "/ninja/widgets", {"name": "w", "size": 1}, content_type="application/json", **headers
        )
        assert response.status_code == 201
    ((_, executed_labels),) = observed(sink, metrics.EXECUTION_TIME)
    ((age, replayed_labels),) = observed(sink, metrics.REPLAY_AGE)
    assert executed_labels == replayed_labels and "widgets" in executed_labels["endpoint"]
    assert 0 <= age < 60
