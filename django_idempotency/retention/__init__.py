"""Retention: each record forgotten once its own window and lease are over (docs/retention.md).

:func:`sweep_all` (:func:`sweep` of every schema that holds records: one, or each
tenant's on a schema-per-tenant database) is the one entry point of the Celery task
and of the ``idempotency_sweep`` management command (``sweeper``); on PostgreSQL's
day-partitioned record table it creates the days ahead and drops whole past days
(``partitions``), elsewhere it deletes in batches. Sent outbox messages are swept
likewise.
"""

from __future__ import annotations

from django_idempotency.retention.sweeper import SweepReport, sweep, sweep_all

__all__ = ["SweepReport", "sweep", "sweep_all"]
