"""Celery tasks: thin ``@shared_task`` wrappers over plain functions. Optional.

The only module that imports Celery (``pip install django-idempotency[celery]``);
nothing else in the package imports it, so the app works without Celery, with the
``idempotency_relay`` management command instead. Schedule with beat, e.g.::

    CELERY_BEAT_SCHEDULE = {
        "idempotency-relay": {"task": "django_idempotency.relay_outbox", "schedule": 5.0},
    }
"""

from __future__ import annotations

from celery import current_app, shared_task  # type: ignore[import-untyped]

from django_idempotency import relay
from django_idempotency.store.routing import all_databases


@shared_task(name="django_idempotency.relay_outbox", ignore_result=True)  # type: ignore[untyped-decorator]
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
            (default: the router's), one after the other.
        max_batches: batches per database at most.
        threads: handlers run at the same time (default: ``OUTBOX_RELAY_THREADS``).

    Returns:
        The number of messages handled (sent, retried or dead-lettered).
    """
    aliases = (using,) if using else all_databases()
    return sum(
        relay.deliver_due(
            batch_size=batch_size, using=alias, max_batches=max_batches, threads=threads
        )
        for alias in aliases
    )


def send_relay_task(using: str | None = None) -> bool:
    """Send :func:`relay_outbox` to the broker now, if a Celery app is configured.

    "Configured" means the current Celery app has a ``broker_url``: a project that
    installed Celery without setting up an app is left alone. The message is sent
    without Celery's publish retries, so a broker that is down fails fast.

    Returns:
        Whether the task was sent.

    Raises:
        Exception: whatever the broker client raised (``outbox.kick`` logs it).
    """
    if not current_app.conf.broker_url:
        return False
    relay_outbox.apply_async(kwargs={"using": using}, retry=False)
    return True


@shared_task(name="django_idempotency.sweep", ignore_result=True)  # type: ignore[untyped-decorator]
def sweep(using: str | None = None, dry_run: bool = False) -> dict[str, object]:
    """Retention sweeper (docs/retention.md); see ``retention.sweep``. Schedule it with beat.

    Args:
        using: one database alias; ``None``: every alias of the ``DATABASES`` setting
            (default: the router's), one after the other.
        dry_run: change nothing; report what would be done.

    Returns:
        The sweep report as a JSON-serialisable dict (``SweepReport.as_dict``); with
        several databases, ``{"databases": [report, ...]}``, one per alias.
    """
    from django_idempotency import retention

    aliases = (using,) if using else all_databases()
    reports = [retention.sweep(alias, dry_run=dry_run).as_dict() for alias in aliases]
    return reports[0] if len(reports) == 1 else {"databases": reports}
