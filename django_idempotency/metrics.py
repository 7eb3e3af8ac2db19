"""Metrics hooks (docs/observability.md): counters fed by the signals, gauges read at scrape.

A *sink* receives every metric event; :func:`connect` wires one to the signals of
``django_idempotency.signals`` (requests and the outbox's relay).
The app ships :class:`InMemoryMetrics` (tests, debugging) and a Prometheus sink
(``django_idempotency.contrib.prometheus``); an OpenTelemetry sink is ten lines
(docs/observability.md). Labels are bounded: the endpoint (``"POST /v1/workers"``,
a route pattern), the response status and the outbox topic; never the key or the
principal. Gauges are not pushed: :func:`outbox_stats` and :func:`partition_stats`
read them from the database when a scrape asks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as _Tally
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from django.dispatch import Signal

from django_idempotency import signals
from django_idempotency.store import reports
from django_idempotency.store.reports import OutboxStats as OutboxStats  # public here
from django_idempotency.store.reports import PartitionStats as PartitionStats  # public here
from django_idempotency.store.routing import outbox_database, record_database

logger = logging.getLogger("django_idempotency.metrics")


@dataclass(frozen=True)
class Metric:
    """A metric's definition: exporters create their instruments from it.

    Attributes:
        name: snake_case, without prefix or unit suffix (``"replays"``); an exporter
            adds its namespace and ``_total`` for counters.
        description: one sentence for ``# HELP``.
        labels: the label names every event of this metric carries.
        kind: ``"counter"`` (counts events), ``"histogram"`` (observes values) or
            ``"gauge"`` (its value now: each observation replaces the last).
        buckets: a histogram's upper bounds in its unit, ascending (``()``: the
            exporter's default).
    """

    name: str
    description: str
    labels: tuple[str, ...]
    kind: str = "counter"
    buckets: tuple[float, ...] = ()


_E = ("endpoint",)
_ES = ("endpoint", "status")

CLAIMS = Metric("claims", "Keys claimed: first executions and takeovers.", _E)
REPLAYS = Metric("replays", "Stored responses replayed (Idempotent-Replayed: true).", _ES)
IN_FLIGHT = Metric("in_flight_conflicts", "Duplicates answered 409: original in flight.", _E)
KEY_REUSES = Metric("key_reuses", "Keys reused with a different request: 422.", _E)
TAKEOVERS = Metric(
    "takeovers", "Claims taken over by a retry once their lease ran out or was ended.", _E
)
PRESENCE_TAKEOVERS = Metric(
    "presence_takeovers",
    "Claims taken over before their lease ended: the owner's database session was gone.",
    _E,
)
WOKEN_WAITERS = Metric(
    "woken_waiters", "Waiting duplicates woken by the owner's completion (not polling).", _E
)
WAITERS_FULL = Metric(
    "waiters_full", "Duplicates answered 409 at once: MAX_WAITERS already waiting.", _E
)
FENCED = Metric(
    "fenced_rollbacks", "Completions fenced off (lease lost): the view's writes rolled back.", _E
)
RELEASES = Metric(
    "releases",
    "Claims released so the client can retry; status 'exception' when the view raised.",
    _ES,
)
COMPLETIONS = Metric("completions", "Responses stored for replay.", _ES)
STORE_FAILURES = Metric(
    "store_failures", "Requests answered 503: the store failed (claim or completion).", _E
)
OUTBOX_DELIVERED = Metric("outbox_delivered", "Outbox messages delivered.", ("topic",))
OUTBOX_FAILURES = Metric("outbox_failures", "Outbox deliveries failed, to retry.", ("topic",))
OUTBOX_DEAD = Metric("outbox_dead_lettered", "Outbox messages dead-lettered.", ("topic",))
OUTBOX_DELIVERY_LAG = Metric(
    "outbox_delivery_lag_seconds",
    "Seconds from enqueue to the delivery attempt that succeeded.",
    ("topic",),
    kind="histogram",
)

# Failure signatures a correct server cannot prevent (docs/observability.md).
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
EXECUTION_TIME = Metric(
    "execution_seconds", "Seconds each execution ran under its claim.", _E, "histogram", _SECONDS
)
NEAR_LEASE = Metric(
    "executions_near_lease", "Executions past LEASE_WARNING_FRACTION of their lease.", _E
)
_HOURS = (0.25, 1, 3, 6, 12, 18, 22, 24, 36, 48, 72, 168)
REPLAY_AGE = Metric(
    "replay_age_seconds",
    "Age of the record (seconds since its claim) at each replay.",
    _E,
    "histogram",
    (1, 10, 60, 300, *(h * 3600.0 for h in _HOURS)),
)
LATE_REPLAYS = Metric(
    "replays_near_window_end", "Replays past RETENTION_WARNING_FRACTION of the window.", _E
)
KEYS_MINTED = Metric(
    "keys_minted_groups", "Principal+fingerprint groups under several keys (audit).", _E, "gauge"
)
AUDIT_TIME = Metric(
    "keys_minted_audit_timestamp_seconds", "Unix time the last audit finished.", (), "gauge"
)

#: Every metric :func:`connect` reports, in a stable order.
METRICS = (
    CLAIMS,
    REPLAYS,
    IN_FLIGHT,
    KEY_REUSES,
    TAKEOVERS,
    PRESENCE_TAKEOVERS,
    WOKEN_WAITERS,
    WAITERS_FULL,
    FENCED,
    RELEASES,
    COMPLETIONS,
    STORE_FAILURES,
    OUTBOX_DELIVERED,
    OUTBOX_FAILURES,
    OUTBOX_DEAD,
    OUTBOX_DELIVERY_LAG,
    EXECUTION_TIME,
    NEAR_LEASE,
    REPLAY_AGE,
    LATE_REPLAYS,
    KEYS_MINTED,
    AUDIT_TIME,
)


class MetricsSink(Protocol):
    """What :func:`connect` feeds. Methods run on the request path: cheap, no raising."""

    def increment(self, metric: Metric, labels: Mapping[str, str]) -> None:
        """Add one to the counter ``metric`` with these label values."""

    def observe(self, metric: Metric, value: float, labels: Mapping[str, str]) -> None:
        """Record ``value`` (seconds for ``*_seconds``) in ``metric``.

        A histogram observes it; a gauge (``kind == "gauge"``) takes it as its value now.
        """


def _status(value: object) -> str:
    return "exception" if value is None else str(value)


def _events(kwargs: Mapping[str, Any], signal_name: str) -> list[tuple[Metric, dict[str, str]]]:
    """The metric events one signal stands for, with their labels."""
    endpoint = {"endpoint": str(kwargs.get("endpoint", ""))}
    if signal_name == "claimed":
        events = [(CLAIMS, endpoint)]
        if kwargs.get("taken_over"):
            events.append((PRESENCE_TAKEOVERS if kwargs.get("presence") else TAKEOVERS, endpoint))
        return events
    if signal_name == "executed":
        return [(NEAR_LEASE, endpoint)] if kwargs.get("near_lease") else []
    if signal_name == "in_flight" and kwargs.get("waiters_full"):
        return [(IN_FLIGHT, endpoint), (WAITERS_FULL, endpoint)]
    simple = {
        "woken": WOKEN_WAITERS,
        "in_flight": IN_FLIGHT,
        "mismatched": KEY_REUSES,
        "fenced": FENCED,
        "store_failed": STORE_FAILURES,
    }
    if signal_name in simple:
        return [(simple[signal_name], endpoint)]
    with_status = {"replayed": REPLAYS, "released": RELEASES, "completed": COMPLETIONS}
    events = [(with_status[signal_name], {**endpoint, "status": _status(kwargs.get("status"))})]
    if signal_name == "replayed" and kwargs.get("near_window_end"):
        events.append((LATE_REPLAYS, endpoint))
    return events


def _observations(kwargs: Mapping[str, Any], signal_name: str) -> list[tuple[Metric, float]]:
    """The histogram observations one signal stands for (labelled by its endpoint)."""
    if signal_name == "executed":
        return [(EXECUTION_TIME, float(kwargs.get("duration") or 0.0))]
    if signal_name == "replayed" and kwargs.get("age") is not None:
        return [(REPLAY_AGE, max(0.0, float(kwargs["age"])))]
    return []


def _signals() -> dict[str, Signal]:
    found = {
        name: getattr(signals, name)
        for name in (
            "claimed",
            "replayed",
            "in_flight",
            "woken",
            "mismatched",
            "fenced",
            "released",
            "completed",
            "store_failed",
            "executed",
            "audited",
        )
    }
    found.update(
        outbox_delivered=signals.outbox_delivered,
        outbox_failed=signals.outbox_failed,
        outbox_dead=signals.outbox_dead_lettered,
    )
    return found


def _audited(sink: MetricsSink, kwargs: Mapping[str, Any], reported: set[str]) -> None:
    """Set the gauges of an audit; endpoints of an earlier audit not found now go to 0."""
    groups: Mapping[str, int] = kwargs.get("groups") or {}
    for endpoint in sorted(reported - set(groups)):
        sink.observe(KEYS_MINTED, 0.0, {"endpoint": endpoint})
    for endpoint, count in groups.items():
        sink.observe(KEYS_MINTED, float(count), {"endpoint": str(endpoint)})
    reported.clear()
    reported.update(str(endpoint) for endpoint in groups)
    sink.observe(AUDIT_TIME, time.time(), {})


def _receiver(sink: MetricsSink, signal_name: str) -> Callable[..., None]:
    outbox = {"outbox_failed": OUTBOX_FAILURES, "outbox_dead": OUTBOX_DEAD}
    reported: set[str] = set()  # endpoints whose keys_minted gauge this sink has set

    def receive(sender: Any, **kwargs: Any) -> None:
        try:
            if signal_name == "audited":
                _audited(sink, kwargs, reported)
                return
            if signal_name == "outbox_delivered":
                labels = {"topic": str(sender)}
                sink.increment(OUTBOX_DELIVERED, labels)
                sink.observe(OUTBOX_DELIVERY_LAG, float(kwargs.get("lag") or 0.0), labels)
            elif signal_name in outbox:
                sink.increment(outbox[signal_name], {"topic": str(sender)})
            else:
                for metric, labels in _events(kwargs, signal_name):
                    sink.increment(metric, labels)
                for metric, value in _observations(kwargs, signal_name):
                    sink.observe(metric, value, {"endpoint": str(kwargs.get("endpoint", ""))})
        except Exception:  # a broken sink must never break a request
            logger.warning("metrics sink %r failed on %s", sink, signal_name, exc_info=True)

    return receive


def _uid(sink: MetricsSink, signal_name: str) -> str:
    return f"django_idempotency.metrics:{id(sink)}:{signal_name}"


def connect(sink: MetricsSink) -> None:
    """Feed ``sink`` every metric event from now on (idempotent per sink).

    Call it once the apps are ready, e.g. in your ``AppConfig.ready()``. The signals
    hold a strong reference to the sink until :func:`disconnect`.
    """
    for name, signal in _signals().items():
        signal.connect(_receiver(sink, name), weak=False, dispatch_uid=_uid(sink, name))


def disconnect(sink: MetricsSink) -> None:
    """Stop feeding ``sink``; a sink that was not connected is ignored."""
    for name, signal in _signals().items():
        signal.disconnect(dispatch_uid=_uid(sink, name))


class InMemoryMetrics:
    """A thread-safe sink that keeps counts and observations in memory.

    For tests and debugging (``metrics.connect(InMemoryMetrics())``), not for
    production export: nothing is shared between processes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: _Tally[tuple[str, tuple[tuple[str, str], ...]]] = _Tally()
        self.observations: dict[str, list[tuple[float, dict[str, str]]]] = {}

    def increment(self, metric: Metric, labels: Mapping[str, str]) -> None:
        """Count one event of ``metric`` with ``labels``."""
        with self._lock:
            self.counts[metric.name, tuple(sorted(labels.items()))] += 1

    def observe(self, metric: Metric, value: float, labels: Mapping[str, str]) -> None:
        """Keep ``value`` with its ``labels``."""
        with self._lock:
            self.observations.setdefault(metric.name, []).append((value, dict(labels)))

    def value(self, metric: Metric | str, **labels: str) -> int:
        """Events counted for ``metric`` whose labels include ``labels`` (all if none)."""
        name = metric if isinstance(metric, str) else metric.name
        wanted = set(labels.items())
        with self._lock:
            return sum(
                n for (m, items), n in self.counts.items() if m == name and wanted <= set(items)
            )


def outbox_stats(using: str | None = None) -> OutboxStats:
    """Count the outbox's messages and measure its lag with the store's clock.

    One statement on PostgreSQL: aggregates over the pending rows, and a count of the
    dead ones (no index covers ``state = 'dead'``, so that count reads the table,
    sent rows included until the sweeper removes them). Meant for a scrape every
    15-60 s, not per request.

    Args:
        using: database alias (default: the router's choice for ``OutboxMessage``).

    Raises:
        django.db.DatabaseError: the database failed (the caller decides; the
            Prometheus collector skips the gauges for that scrape).
    """
    return reports.outbox_stats(using or outbox_database())


def partition_stats(using: str | None = None) -> PartitionStats | None:
    """The day partitions ahead and the records waiting in the default partition.

    PostgreSQL's day-partitioned record table (docs/retention.md): ``days_ahead`` is
    the number of consecutive days after today that have a partition of their own
    (the sweeper keeps ``MAX_RETENTION`` plus ``PARTITIONS_AHEAD`` days; fewer means
    it has not run for that long), ``default_rows`` the records claimed while their day
    had no partition (counted up to 1,000). Catalog queries and one bounded count:
    meant for a scrape every 15-60 s.

    Args:
        using: database alias (default: the router's choice for records).

    Returns:
        The :class:`PartitionStats`, or ``None`` when the record table is not
        partitioned (other databases, ``PARTITION_RECORDS = False``).

    Raises:
        django.db.DatabaseError: the database failed.
    """
    return reports.partition_stats(using or record_database())
