"""``manage.py idempotency_sweep``: the retention sweeper without Celery (docs/retention.md).

One sweep by default (cron); with ``--loop``, a sweep every ``--interval`` seconds
until ``SIGTERM`` or Ctrl-C, riding out database outages as the relay command does
(``management.jobs``). On a schema-per-tenant database (django-tenants) each run
sweeps every schema that holds the record table (docs/tenants.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils.translation import ngettext

from django_idempotency import retention
from django_idempotency.management.jobs import UNAVAILABLE, GracefulStop, Outage, OwnConnections
from django_idempotency.store.routing import all_databases

logger = logging.getLogger("django_idempotency")


class Command(BaseCommand):
    """Create partitions ahead, drop or delete expired days, sweep sent outbox messages."""

    help = (
        "Forget idempotency records whose own retention window and lease are over, "
        "and sent outbox messages older than OUTBOX_RETENTION. On a partitioned "
        "PostgreSQL table it creates the partitions ahead and drops whole past days "
        "(keeping a day while a record in it is still live); elsewhere it deletes in "
        "batches. On a django-tenants database it sweeps every tenant schema. Safe to run twice "
        "at once and to re-run. With --dry-run it only reports what it would do. With "
        "--loop it sweeps every --interval seconds until stopped (SIGTERM, Ctrl-C), "
        "riding out database outages with backoff."
    )

    def add_arguments(self, parser: CommandParser) -> None:  # noqa: D102
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Change nothing; report what would be created, dropped or deleted.",
        )
        parser.add_argument(
            "--database",
            default=None,
            choices=tuple(connections),
            help="Database alias (default: each alias of the IDEMPOTENCY DATABASES "
            "setting, else the router's choice).",
        )
        parser.add_argument(
            "--loop",
            action="store_true",
            help="Sweep again every --interval seconds until stopped (SIGTERM, Ctrl-C), "
            "for a deployment with neither cron nor Celery beat.",
        )
        parser.add_argument(
            "--interval",
            type=float,
            default=3600.0,
            help="With --loop: seconds from one sweep of a database to the next (default 3600).",
        )

    def handle(self, *args: Any, **options: Any) -> None:  # noqa: D102
        if options["interval"] <= 0:
            raise CommandError("--interval must be more than 0 seconds.")
        with OwnConnections():  # a process that calls the command keeps no session of it
            self._handle(options)

    def _handle(self, options: dict[str, Any]) -> None:
        aliases = (options["database"],) if options["database"] else all_databases()
        if options["loop"]:
            self._loop(aliases, options["dry_run"], options["interval"])
            return
        failed = False
        for alias in aliases:
            try:
                failed = self._sweep(alias, options["dry_run"]) or failed
            except UNAVAILABLE as exc:
                raise CommandError(f"database {alias!r} unavailable: {exc}") from exc
        if failed:
            raise CommandError(
                "Some partitions could not be created or dropped; run the sweep again."
            )

    def _loop(self, aliases: tuple[str, ...], dry_run: bool, interval: float) -> None:
        """Sweep each database every ``interval`` seconds until SIGTERM or Ctrl-C.

        A partition that could not be created or dropped is reported and tried again by
        the next sweep; an unavailable database is logged once and retried with backoff.
        """
        outages = {alias: Outage("idempotency sweep", alias, logger) for alias in aliases}
        due = dict.fromkeys(aliases, 0.0)  # time.monotonic() of each database's next sweep
        stop = GracefulStop()
        try:
            with stop:
                while not stop.requested:
                    for alias in aliases:
                        if stop.requested or due[alias] > time.monotonic():
                            continue
                        try:
                            self._sweep(alias, dry_run)
                        except UNAVAILABLE as exc:
                            outages[alias].failed(exc)
                            due[alias] = outages[alias].retry_at
                            continue
                        outages[alias].recovered()
                        due[alias] = time.monotonic() + interval
                    stop.sleep(min(due.values()) - time.monotonic())  # the interval, not sync
        except KeyboardInterrupt:
            pass
        if stop.requested:
            logger.info("idempotency sweep stopped on SIGTERM")

    def _sweep(self, alias: str, dry_run: bool) -> bool:
        """Sweep one database (each of its tenant schemas) and report it.

        Returns whether a partition could not be created or dropped.
        """
        failed = False
        for report in retention.sweep_all(alias, dry_run=dry_run):
            failed = self._report(report) or failed
        return failed

    def _report(self, report: retention.SweepReport) -> bool:
        """Write one schema's report; whether a partition could not be created or dropped."""
        where = f"database {report.database!r}"
        if report.schema is not None:
            where += f", schema {report.schema!r}"
        if report.skipped:
            self.stdout.write(f"Another sweeper is running on {where}; nothing done there.")
            return False
        dry = report.dry_run

        def verb(present: str, past: str) -> str:
            return f"Would {present}" if dry else past

        self.stdout.write(
            f"{'Dry run: ' if dry else ''}{where} ({report.method}); "
            f"now {report.now:%Y-%m-%d %H:%M:%S} UTC; records whose window and lease "
            "are over are forgotten"
            + (
                f" (days ending by {report.cutoff:%Y-%m-%d %H:%M} UTC)."
                if report.method == "partitions"
                else "."
            )
        )
        for day in report.created:
            self.stdout.write(f"{verb('create', 'Created')} partition for {day:%Y-%m-%d}.")
        if report.moved:
            noun = ngettext("record", "records", report.moved)
            self.stdout.write(
                f"Moved {report.moved} {noun} from the default partition into their days."
            )
        for partition in report.dropped:
            rows = "unknown" if partition.rows < 0 else f"~{partition.rows}"
            self.stdout.write(
                f"{verb('drop', 'Dropped')} partition {partition.name} ({rows} rows)."
            )
        counts = (
            [("record", "records", report.deleted_records)]
            if report.method == "delete" or report.deleted_records
            else []
        )
        counts.append(("sent outbox message", "sent outbox messages", report.deleted_outbox))
        for singular, plural, count in counts:
            noun = ngettext(singular, plural, count)
            self.stdout.write(f"{verb('delete', 'Deleted')} {count} {noun}.")
        for name in report.held:
            self.stdout.write(f"Kept partition {name}: a record in it is still live.")
        for error in report.errors:
            self.stderr.write(f"Not done this time: {error}")
        return bool(report.errors)
