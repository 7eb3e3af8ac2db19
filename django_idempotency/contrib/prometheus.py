"""Prometheus metrics: ``pip install django-idempotency[prometheus]``.

Call :func:`install` once, when the apps are ready (your ``AppConfig.ready()``)::

    from django_idempotency.contrib import prometheus

    prometheus.install()

It registers, in ``prometheus_client``'s default registry (or ``registry=``), one
counter per event of ``django_idempotency.metrics`` (``django_idempotency_replays_total``,
``..._in_flight_conflicts_total``, ``..._key_reuses_total``, ``..._takeovers_total``,
``..._fenced_rollbacks_total`` ...), the histograms ``..._outbox_delivery_lag_seconds``,
``..._execution_seconds`` and ``..._replay_age_seconds``, the gauges the keys-minted
audit sets (``..._keys_minted_groups``) and the outbox gauges
(``..._outbox_lag_seconds``, ``..._outbox_due_messages``, ``..._outbox_dead_messages``
...) and those of the day-partitioned record table (``..._partition_days_ahead``,
``..._default_partition_rows``), read from the database at each scrape. Expose the
registry as you already do (``django-prometheus``, ``prometheus_client.start_http_server``,
``make_wsgi_app``). Metric names: docs/observability.md; alert rules and a Grafana
dashboard ship in ``django_idempotency/monitoring/`` (docs/operations.md).

``prometheus_client`` is imported when this module is, never by the rest of the app.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from django.db import DatabaseError, connections
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from django_idempotency import metrics
from django_idempotency.store.routing import outbox_database, record_database

logger = logging.getLogger("django_idempotency.metrics")

NAMESPACE = "django_idempotency"

#: Histogram buckets for the outbox delivery lag, seconds (a relay every 5 s to hours).
LAG_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600, float("inf"))


class PrometheusSink:
    """A metrics sink writing ``prometheus_client`` instruments.

    One counter, histogram or gauge per metric of ``django_idempotency.metrics.METRICS``;
    a histogram's buckets are the metric's own (``Metric.buckets``), else
    :data:`LAG_BUCKETS`. Gauges keep the most recent value across processes in
    ``prometheus_client``'s multiprocess mode.

    Args:
        registry: where the instruments are registered (default: the global one).
        namespace: metric name prefix.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY, namespace: str = NAMESPACE) -> None:
        self.registry = registry
        self.instruments: dict[str, Counter | Histogram | Gauge] = {}
        for metric in metrics.METRICS:
            if metric.kind == "histogram":
                self.instruments[metric.name] = Histogram(
                    metric.name,
                    metric.description,
                    metric.labels,
                    namespace=namespace,
                    registry=registry,
                    buckets=(*metric.buckets, float("inf")) if metric.buckets else LAG_BUCKETS,
                )
            elif metric.kind == "gauge":
                self.instruments[metric.name] = Gauge(
                    metric.name,
                    metric.description,
                    metric.labels,
                    namespace=namespace,
                    registry=registry,
                    multiprocess_mode="mostrecent",
                )
            else:
                self.instruments[metric.name] = Counter(
                    metric.name,
                    metric.description,
                    metric.labels,
                    namespace=namespace,
                    registry=registry,
                )

    def increment(self, metric: metrics.Metric, labels: Mapping[str, str]) -> None:
        """Add one to the counter for ``metric``."""
        counter = self.instruments[metric.name]
        assert isinstance(counter, Counter)
        counter.labels(**labels).inc()

    def observe(self, metric: metrics.Metric, value: float, labels: Mapping[str, str]) -> None:
        """Observe ``value`` in the histogram for ``metric``, or set its gauge to it."""
        instrument = self.instruments[metric.name]
        child = instrument.labels(**labels) if labels else instrument
        if isinstance(child, Gauge):
            child.set(value)
        else:
            assert isinstance(child, Histogram)
            child.observe(value)

    def unregister(self) -> None:
        """Remove the instruments from the registry."""
        for instrument in self.instruments.values():
            self.registry.unregister(instrument)


class _StatsCollector(Collector):
    """Gauges read from the database at scrape time: one statistics read per scrape.

    Subclasses name their gauges (``_ROWS``: metric name, help, field of the
    statistics), how to read the statistics and which database they read.
    """

    _ROWS: tuple[tuple[str, str, str], ...] = ()
    _WHAT = ""

    def __init__(
        self,
        using: str | None = None,
        namespace: str = NAMESPACE,
        *,
        close_connection: bool = False,
    ) -> None:
        self.using = using
        self.prefix = f"{namespace}_" if namespace else ""
        self.close_connection = close_connection

    def _read(self) -> Any:
        raise NotImplementedError

    def _database(self) -> str:
        raise NotImplementedError

    def _families(self, stats: Any) -> list[GaugeMetricFamily]:
        families = []
        for name, doc, field in self._ROWS:
            value = None if stats is None else getattr(stats, field)
            families.append(
                GaugeMetricFamily(
                    self.prefix + name, doc, value=None if value is None else float(value)
                )
            )
        return families

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The gauges' names, without touching the database (registration)."""
        return iter(self._families(None))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Read the statistics and yield the gauges (none if the database failed)."""
        try:
            stats = self._read()
        except DatabaseError:
            logger.warning("%s gauges skipped: the database failed", self._WHAT, exc_info=True)
            return iter(())
        finally:
            if self.close_connection:
                connection = connections[self.using or self._database()]
                if not connection.in_atomic_block:
                    connection.close()
        return iter(self._families(stats))


class OutboxCollector(_StatsCollector):
    """Outbox gauges computed at scrape time by ``metrics.outbox_stats``.

    Gauges (with the namespace prefix): ``outbox_pending_messages``,
    ``outbox_due_messages``, ``outbox_dead_messages``, ``outbox_lag_seconds`` and
    ``outbox_oldest_pending_age_seconds``. A database error skips them for that
    scrape (and is logged); Prometheus then shows the series as absent, which
    ``absent()`` alerts can catch.

    Args:
        using: database alias (default: the router's choice for ``OutboxMessage``).
        namespace: metric name prefix.
        close_connection: close this thread's connection after each scrape. Use it
            when scrapes run in threads of their own (``start_http_server``), so no
            connection is left open per scrape thread.
    """

    _WHAT = "outbox"
    _ROWS = (
        ("outbox_pending_messages", "Outbox messages not yet delivered.", "pending"),
        ("outbox_due_messages", "Pending outbox messages due now (relay backlog).", "due"),
        ("outbox_dead_messages", "Dead-lettered outbox messages.", "dead"),
        ("outbox_lag_seconds", "Seconds the oldest due message has waited.", "lag"),
        (
            "outbox_oldest_pending_age_seconds",
            "Seconds since the oldest pending message was enqueued.",
            "oldest_pending_age",
        ),
    )

    def _read(self) -> metrics.OutboxStats:
        return metrics.outbox_stats(self.using)

    def _database(self) -> str:
        return outbox_database()


class PartitionCollector(_StatsCollector):
    """Gauges of the day-partitioned record table, computed at scrape time.

    ``partition_days_ahead`` (days after today with a partition of their own) and
    ``default_partition_rows`` (records waiting in the default partition, counted up
    to 1,000), by ``metrics.partition_stats`` (docs/retention.md). When the record
    table is not partitioned the gauges are described without a value (no series);
    when the database failed, nothing is yielded (logged).

    Args:
        using: database alias (default: the router's choice for records).
        namespace: metric name prefix.
        close_connection: as for :class:`OutboxCollector`.
    """

    _WHAT = "partition"
    _ROWS = (
        (
            "partition_days_ahead",
            "Days after today with a record partition of their own.",
            "days_ahead",
        ),
        (
            "default_partition_rows",
            "Records waiting in the default partition (counted up to 1000).",
            "default_rows",
        ),
    )

    def _read(self) -> metrics.PartitionStats | None:
        return metrics.partition_stats(self.using)

    def _database(self) -> str:
        return record_database()


_installed: dict[int, tuple[PrometheusSink, list[Collector]]] = {}


def install(
    registry: CollectorRegistry = REGISTRY,
    *,
    namespace: str = NAMESPACE,
    outbox: bool = True,
    partitions: bool = True,
    using: str | None = None,
    close_connection: bool = False,
) -> PrometheusSink:
    """Create the instruments, connect them to the signals, register the outbox gauges.

    Idempotent per registry: a second call returns the first call's sink.

    Args:
        registry: the ``prometheus_client`` registry (default: the global one).
        namespace: metric name prefix.
        outbox: register the :class:`OutboxCollector` gauges (needs the outbox table:
            migrated). In ``prometheus_client`` multiprocess mode, register them only
            in the process that serves the scrape (docs/observability.md).
        partitions: register the :class:`PartitionCollector` gauges (they yield
            nothing unless the record table is day-partitioned).
        using: database alias the gauges read.
        close_connection: see :class:`OutboxCollector`.

    Returns:
        The connected sink.
    """
    found = _installed.get(id(registry))
    if found is not None:
        return found[0]
    sink = PrometheusSink(registry, namespace)
    collectors: list[Collector] = []
    if outbox:
        collectors.append(OutboxCollector(using, namespace, close_connection=close_connection))
    if partitions:
        collectors.append(PartitionCollector(using, namespace, close_connection=close_connection))
    for collector in collectors:
        registry.register(collector)
    metrics.connect(sink)
    _installed[id(registry)] = (sink, collectors)
    return sink


def uninstall(registry: CollectorRegistry = REGISTRY) -> None:
    """Undo :func:`install` for ``registry``: disconnect and unregister everything."""
    found = _installed.pop(id(registry), None)
    if found is None:
        return
    sink, collectors = found
    metrics.disconnect(sink)
    sink.unregister()
    for collector in collectors:
        registry.unregister(collector)
