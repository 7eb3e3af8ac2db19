"""``manage.py idempotency_sweep``: the retention sweeper without Celery (docs/retention.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import ngettext

from django_idempotency import retention


class Command(BaseCommand):
    """Create partitions ahead, drop or delete expired days, sweep sent outbox messages."""

    help = (
        "Forget idempotency records older than the longest retention window "
        "(IDEMPOTENCY['MAX_RETENTION']) and sent outbox messages older than "
        "OUTBOX_RETENTION. On a partitioned PostgreSQL table it creates the partitions "
        "ahead and drops whole days; elsewhere it deletes in batches. Safe to run twice "
        "at once and to re-run. With --dry-run it only reports what it would do."
    )

    def add_arguments(self, parser: CommandParser) -> None:  # noqa: D102
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Change nothing; report what would be created, dropped or deleted.",
        )
        parser.add_argument(
            "--database", default=None, help="Database alias (default: the router's choice)."
        )

    def handle(self, *args: Any, **options: Any) -> None:  # noqa: D102
        report = retention.sweep(options["database"], dry_run=options["dry_run"])
        if report.skipped:
            self.stdout.write("Another sweeper is running on this database; nothing done.")
            return
        dry = report.dry_run

        def verb(present: str, past: str) -> str:
            return f"Would {present}" if dry else past

        self.stdout.write(
            f"{'Dry run: ' if dry else ''}database {report.database!r} ({report.method}); "
            f"now {report.now:%Y-%m-%d %H:%M:%S} UTC; records created before "
            f"{report.cutoff:%Y-%m-%d %H:%M} UTC are past retention."
        )
        for day in report.created:
            self.stdout.write(f"{verb('create', 'Created')} partition for {day:%Y-%m-%d}.")
        for partition in report.dropped:
            rows = "unknown" if partition.rows < 0 else f"~{partition.rows}"
            self.stdout.write(
                f"{verb('drop', 'Dropped')} partition {partition.name} ({rows} rows)."
            )
        counts = (
            [("record", "records", report.deleted_records)] if report.method == "delete" else []
        )
        counts.append(("sent outbox message", "sent outbox messages", report.deleted_outbox))
        for singular, plural, count in counts:
            noun = ngettext(singular, plural, count)
            self.stdout.write(f"{verb('delete', 'Deleted')} {count} {noun}.")
        for error in report.errors:
            self.stderr.write(f"Not dropped this time: {error}")
        if report.errors:
            raise CommandError("Some partitions could not be dropped; run the sweep again.")
