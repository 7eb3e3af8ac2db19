"""metrics.py: the signal -> counter mapping, end to end through real requests, and the
outbox gauges."""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, transaction
from django.test import override_settings

from django_idempotency import metrics, outbox, signals
from django_idempotency.metrics import InMemoryMetrics
from django_idempotency.models import OutboxMessage, OutboxState
from django_idempotency.outbox import relay
from django_idempotency.testing import travel
from tests.support.clients import client_for
from tests.support.testapp.gates import HOOKS

pytestmark = pytest.mark.django_db

WIDGETS = "POST /widgets"


@pytest.fixture
def sink() -> Iterator[InMemoryMetrics]:
    recorded = InMemoryMetrics()
    metrics.connect(recorded)
    yield recorded
    metrics.disconnect(recorded)


def post(api: Any, path: str, key: str, data: dict[str, Any]) -> Any:
    return api.post(path, data, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_every_signal_maps_to_its_counter(sink):
    base = {"principal": "p", "endpoint": "POST /x", "key_hash": "abc"}
    signals.claimed.send("POST /x", taken_over=False, **base)
    signals.claimed.send("POST /x", taken_over=True, **base)
    signals.replayed.send("POST /x", status=201, **base)
    signals.in_flight.send("POST /x", **base)
    signals.mismatched.send("POST /x", **base)
    signals.fenced.send("POST /x", **base)
    signals.released.send("POST /x", status=None, **base)
    signals.released.send("POST /x", status=503, **base)
    signals.completed.send("POST /x", status=402, **base)
    signals.store_failed.send("POST /x", error=DatabaseError("down"), **base)
    assert sink.value(metrics.CLAIMS, endpoint="POST /x") == 2
    assert sink.value(metrics.TAKEOVERS) == 1
    assert sink.value(metrics.REPLAYS, status="201") == 1
    assert sink.value(metrics.IN_FLIGHT) == 1
    assert sink.value(metrics.KEY_REUSES) == 1
    assert sink.value(metrics.FENCED) == 1
    assert sink.value(metrics.RELEASES, status="exception") == 1
    assert sink.value(metrics.RELEASES, status="503") == 1
    assert sink.value(metrics.COMPLETIONS, status="402") == 1
    assert sink.value(metrics.STORE_FAILURES) == 1
    # labels are bounded: never the principal or the key
    for _name, labels in sink.counts:
        assert {name for name, _ in labels} <= {"endpoint", "status"}


def test_real_requests_feed_the_counters(sink, api, key):
    first = post(api, "/widgets", key, {"name": "a"})
    assert first.status_code == 201
    assert post(api, "/widgets", key, {"name": "a"}).status_code == 201  # replay
    assert post(api, "/widgets", key, {"name": "b"}).status_code == 422
    assert post(api, "/outcome", str(uuid.uuid4()), {"status": 503}).status_code == 503
    assert post(api, "/outcome", str(uuid.uuid4()), {"status": 402}).status_code == 402

    assert sink.value(metrics.CLAIMS, endpoint=WIDGETS) == 1
    assert sink.value(metrics.COMPLETIONS, endpoint=WIDGETS, status="201") == 1
    assert sink.value(metrics.REPLAYS, endpoint=WIDGETS, status="201") == 1
    assert sink.value(metrics.KEY_REUSES, endpoint=WIDGETS) == 1
    assert sink.value(metrics.RELEASES, endpoint="POST /outcome", status="503") == 1
    assert sink.value(metrics.COMPLETIONS, endpoint="POST /outcome", status="402") == 1


def test_in_flight_duplicate_counts_a_409(sink, api, alice, key):
    answers = []

    def duplicate(request):  # runs inside the first request's view: its claim is live
        HOOKS.pop("during_view")
        answers.append(post(client_for(alice), "/widgets", key, {"name": "a"}))

    HOOKS["during_view"] = duplicate
    assert post(api, "/widgets", key, {"name": "a"}).status_code == 201
    assert [a.status_code for a in answers] == [409]
    assert sink.value(metrics.IN_FLIGHT, endpoint=WIDGETS) == 1


def test_takeover_of_a_suspended_phased_request(sink, api, key):
    api.raise_request_exception = False
    HOOKS["crash"] = "after:allocated"
    assert post(api, "/provision", key, {}).status_code == 500
    assert sink.value(metrics.TAKEOVERS) == 0
    assert post(api, "/provision", key, {}).status_code == 201
    assert sink.value(metrics.TAKEOVERS, endpoint="POST /provision") == 1
    assert sink.value(metrics.CLAIMS, endpoint="POST /provision") == 2
    assert sink.value(metrics.COMPLETIONS, endpoint="POST /provision", status="201") == 1


def test_a_broken_sink_never_breaks_a_request(api, key, caplog):
    class Broken:
        def increment(self, metric, labels):
            raise RuntimeError("sink down")

        def observe(self, metric, value, labels):
            raise RuntimeError("sink down")

    broken = Broken()
    metrics.connect(broken)
    try:
        with caplog.at_level(logging.WARNING, logger="django_idempotency.metrics"):
            assert post(api, "/widgets", key, {"name": "a"}).status_code == 201
    finally:
        metrics.disconnect(broken)
    failures = [r for r in caplog.records if r.exc_info and "metrics sink" in r.getMessage()]
    assert failures and all(str(r.exc_info[1]) == "sink down" for r in failures)


def test_connect_is_idempotent_and_disconnect_stops(api):
    sink = InMemoryMetrics()
    metrics.connect(sink)
    metrics.connect(sink)
    post(api, "/widgets", str(uuid.uuid4()), {"name": "a"})
    metrics.disconnect(sink)
    post(api, "/widgets", str(uuid.uuid4()), {"name": "b"})
    assert sink.value(metrics.CLAIMS) == 1


# --- outbox --------------------------------------------------------------------------


@pytest.fixture
def handler() -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"fail": False}

    def deliver(message: OutboxMessage, dedup_key: str) -> None:
        if state["fail"]:
            raise RuntimeError("downstream down")

    outbox.register("metrics.topic")(deliver)
    yield state
    outbox.unregister("metrics.topic")


def enqueue(n: int, **kwargs: Any) -> None:
    with transaction.atomic():
        for i in range(n):
            outbox.enqueue("metrics.topic", {"n": i}, **kwargs)


def test_relay_signals_feed_outbox_counters(sink, handler):
    enqueue(2)
    relay.deliver_batch()
    assert sink.value(metrics.OUTBOX_DELIVERED, topic="metrics.topic") == 2
    lags = sink.observations[metrics.OUTBOX_DELIVERY_LAG.name]
    assert len(lags) == 2 and all(
        v >= 0 and labels == {"topic": "metrics.topic"} for v, labels in lags
    )
    handler["fail"] = True
    with override_settings(IDEMPOTENCY={"OUTBOX_MAX_ATTEMPTS": 2}):
        enqueue(1, dedup_key="failing")
        relay.deliver_batch()
        assert sink.value(metrics.OUTBOX_FAILURES) == 1
        with travel(10**5):
            relay.deliver_batch()
    assert sink.value(metrics.OUTBOX_DEAD, topic="metrics.topic") == 1


def test_outbox_stats_counts_and_lag(handler):
    assert metrics.outbox_stats() == metrics.OutboxStats(0, 0, 0, 0.0, 0.0)
    enqueue(3)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    enqueue(1, dedup_key="later", available_at=later)
    with travel(120):
        stats = metrics.outbox_stats()
    assert (stats.pending, stats.due, stats.dead) == (4, 3, 0)
    assert 119 <= stats.lag <= 180  # the oldest due message became due ~120 s ago
    assert 119 <= stats.oldest_pending_age <= 180
    relay.deliver_batch()
    stats = metrics.outbox_stats()
    assert (stats.pending, stats.due) == (1, 0) and stats.lag == 0.0
    OutboxMessage.objects.filter(dedup_key="later").update(state=OutboxState.DEAD)
    assert metrics.outbox_stats().dead == 1


def test_metric_definitions_are_unique_and_documented():
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names))
    assert all(m.description.endswith(".") for m in metrics.METRICS)
    assert json.dumps([m.labels for m in metrics.METRICS])  # plain data
