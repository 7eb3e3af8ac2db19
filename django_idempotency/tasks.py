"""Celery tasks: thin ``@shared_task`` wrappers over plain functions. Optional.

The only module that imports Celery (``pip install django-idempotency[celery]``);
nothing else in the package imports it, so the app works without Celery, with the
``idempotency_relay`` management command instead. Schedule with beat, e.g.::

    CELERY_BEAT_SCHEDULE = {
        "idempotency-relay": {"task": "django_idempotency.relay_outbox", "schedule": 5.0},
    }

The tasks outlive the database the way a beat task should: a run that finds a
database unavailable (``jobs.UNAVAILABLE``) logs it, goes on with the other
databases and returns; the next run (the next beat, or the next kick) tries again.
The outage is logged once per worker process when it starts (``ERROR``) and once when
a run finds the database back (``INFO``), not a traceback every few seconds. They do
not retry themselves: the beat already does, and a task retrying beside it would run
twice as often during an outage. Celery's soft time limit stops the relay task like
any other stop (``relay.Relay``): the delivered messages are marked, the rest handed
back. On a schema-per-tenant database (django-tenants) one run of any task covers
every tenant schema that holds the record table, one after the other; a tenant
deleted while the run reaches it is skipped (docs/tenants.md).
"""

from __future__ import annotations

import logging
from collections import Counter

from celery import shared_task  # type: ignore[import-untyped]
from celery.exceptions import SoftTimeLimitExceeded  # type: ignore[import-untyped]
from django.db import DatabaseError

from django_idempotency import retention, signals
from django_idempotency.management import audit, jobs
from django_idempotency.outbox import relay
from django_idempotency.outbox.kick import RELAY_TASK
from django_idempotency.retention.sweeper import SWEEP_TASK
from django_idempotency.store import tenants
from django_idempotency.store.routing import all_databases

_then = "the next run retries"


@shared_task(name=RELAY_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def relay_outbox(
    batch_size: int | None = None,
    using: str | None = None,
    max_batches: int = 10,
    threads: int | None = None,
) -> int:
    """Deliver the outbox messages due now; see ``relay.deliver_due``.

    Args:
        batch_size: messages claimed per batch (default: ``OUTBOX_BATCH_SIZE``).
        using: one database alias; ``None``: every alias of the ``DATABASES`` setting
            (default: the router's), one after the other; each tenant schema of a
            django-tenants database in turn.
        max_batches: batches per database (per tenant schema) at most.
        threads: handlers run at the same time (default: ``OUTBOX_RELAY_THREADS``).

    Returns:
        The number of messages handled (sent, retried or dead-lettered). A database
        that is unavailable is logged (once per outage) and counts 0.

    Raises:
        celery.exceptions.SoftTimeLimitExceeded: the task's soft time limit; what was
            delivered is marked, the rest handed back.
    """
    logger = logging.getLogger("django_idempotency.outbox")
    aliases = (using,) if using else all_databases()
    total = 0
    for alias in aliases:
        outage = jobs.for_job("outbox relay task", alias, logger, then=_then)
        try:
            for _alias, schema in tenants.targets((alias,)):
                try:
                    total += relay.deliver_due(
                        batch_size=batch_size,
                        using=alias,
                        max_batches=max_batches,
                        threads=threads,
                        stop_on=(SoftTimeLimitExceeded,),
                        schema=schema,
                    )
                except DatabaseError as exc:  # a tenant deleted meanwhile is skipped
                    if not tenants.dropped_during(alias, schema, exc, "outbox relay task"):
                        raise
        except jobs.UNAVAILABLE as exc:
            outage.failed(exc)
            continue
        outage.recovered()
    return total


@shared_task(name=SWEEP_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def sweep(using: str | None = None, dry_run: bool = False) -> dict[str, object]:
    """Retention sweeper (docs/retention.md); see ``retention.sweep``. Schedule it with beat.

    Args:
        using: one database alias; ``None``: every alias of the ``DATABASES`` setting
            (default: the router's), one after the other; each tenant schema of a
            django-tenants database in turn.
        dry_run: change nothing; report what would be done.

    Returns:
        The sweep report as a JSON-serialisable dict (``SweepReport.as_dict``); with
        several databases or tenant schemas, ``{"databases": [report, ...]}``, one per
        alias and schema (each report names its ``schema``). A database
        that is unavailable has ``{"database": alias, "error": "..."}`` instead of its
        report, and the outage is logged (once per outage).
    """
    logger = logging.getLogger("django_idempotency")
    aliases = (using,) if using else all_databases()
    reports: list[dict[str, object]] = []
    for alias in aliases:
        outage = jobs.for_job("idempotency sweep task", alias, logger, then=_then)
        try:
            swept = retention.sweep_all(alias, dry_run=dry_run)
            reports.extend(report.as_dict() for report in swept)
        except jobs.UNAVAILABLE as exc:
            outage.failed(exc)
            reports.append({"database": alias, "error": f"{type(exc).__name__}: {exc}"})
            continue
        outage.recovered()
    return reports[0] if len(reports) == 1 else {"databases": reports}


@shared_task(name=audit.AUDIT_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
def audit_keys_minted(
    window: float = 3600.0, using: str | None = None, limit: int = 20, timeout: float = 30.0
) -> dict[str, object]:
    """Audit keys minted per attempt (``audit.keys_minted``); schedule it with beat.

    Sets the ``keys_minted_groups`` gauges of the metrics sinks connected in the
    worker process (docs/observability.md#failure-signatures), the groups of every
    database audited added up per endpoint, once every database was audited (a run
    with a database unavailable or too slow leaves the gauges as they were), and logs
    a WARNING per endpoint where groups were found.

    Args:
        window: seconds back from now whose claims are audited (the beat interval is
            a good value: each claim is audited about once).
        using: one database alias; ``None``: every alias of the ``DATABASES`` setting
            (default: the router's), one after the other, each tenant schema in turn.
        limit: groups logged at most per database.
        timeout: seconds the audit's statement may run (``statement_timeout``).

    Returns:
        ``{"databases": [...]}``: per alias its ``counts`` (groups per endpoint), or
        its ``error`` (an unavailable database, logged once per outage; a statement
        past its timeout, logged).
    """
    logger = logging.getLogger("django_idempotency")
    aliases = (using,) if using else all_databases()
    reports: list[dict[str, object]] = []
    total: Counter[str] = Counter()
    for alias in aliases:
        outage = jobs.for_job("keys minted audit task", alias, logger, then=_then)
        try:
            report = audit.keys_minted(
                window, using=alias, limit=limit, timeout=timeout, send=False
            )
        except jobs.UNAVAILABLE as exc:
            outage.failed(exc)
            reports.append({"database": alias, "error": f"{type(exc).__name__}: {exc}"})
            continue
        except audit.AuditTooSlow as exc:
            logger.warning("keys minted audit task: database %r: %s", alias, exc)
            reports.append({"database": alias, "error": str(exc)})
            continue
        outage.recovered()
        for endpoint, count in sorted(report.counts.items()):
            logger.warning(
                "keys minted per attempt: %s: %d group(s) of one principal and one request "
                "under several keys in the last %g s (manage.py idempotency_audit lists them)",
                endpoint,
                count,
                window,
                extra={"endpoint": endpoint, "groups": count},
            )
        reports.append({"database": alias, "counts": dict(report.counts)})
        total.update(report.counts)
    if all("counts" in each for each in reports):
        signals.audited.send(None, groups=dict(total), window=window, using=using)
    return {"databases": reports}
