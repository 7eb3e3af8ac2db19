"""``manage.py idempotency_audit``: find keys minted per attempt (docs/operations.md).

Counts, per endpoint, the groups of records with one principal and one fingerprint
(the same request) under several keys, claimed within ``--window``, and lists the most
recent groups for an operator (``management.audit.keys_minted``): a client that sends
a new key with each retry, whose retries each ran the view.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_idempotency.management import audit
from django_idempotency.management.jobs import UNAVAILABLE
from django_idempotency.store.routing import record_database

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """Seconds of ``text``: a number, optionally with ``s``, ``m``, ``h`` or ``d``.

    Raises:
        CommandError: ``text`` is not such a duration, or is 0.
    """
    found = _DURATION.fullmatch(text.strip().lower())
    seconds = float(found.group(1)) * _UNITS[found.group(2)] if found else 0.0
    if seconds <= 0:
        raise CommandError(f"{text!r} is not a duration: give seconds, or 90m, 6h, 1d.")
    return seconds


class Command(BaseCommand):
    """Count and list groups of identical requests under several keys."""

    help = (
        "Find keys minted per attempt: per endpoint, the groups of records with one "
        "principal and one fingerprint (the same request) under several keys, claimed "
        "within --window, and the most recent of them. Each group is a client whose "
        "retries each ran the view: candidates for a business duplicate. One statement "
        "on the created_at index, bounded by --window, --limit and --timeout."
    )

    def add_arguments(self, parser: CommandParser) -> None:  # noqa: D102
        parser.add_argument(
            "--window",
            default="1h",
            help="How far back the claims audited go: seconds, or 90m, 6h, 1d (default 1h). "
            "The cost grows with the records claimed in the window.",
        )
        parser.add_argument(
            "--limit", type=int, default=50, help="List at most this many groups, newest first."
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            help="Seconds the statement may run on PostgreSQL (statement_timeout; default 30).",
        )
        parser.add_argument(
            "--database",
            default=None,
            choices=tuple(connections),
            help="Database alias (default: the router's choice for writing records).",
        )

    def handle(self, *args: Any, **options: Any) -> None:  # noqa: D102
        window = duration(options["window"])
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1.")
        if options["timeout"] <= 0:
            raise CommandError("--timeout must be more than 0 seconds.")
        using = options["database"] or record_database()
        try:
            report = audit.keys_minted(
                window, using=using, limit=options["limit"], timeout=options["timeout"]
            )
        except audit.AuditTooSlow as exc:
            raise CommandError(str(exc)) from exc
        except UNAVAILABLE as exc:
            raise CommandError(f"database {using!r} unavailable: {exc}") from exc
        self.stdout.write(
            f"Claims since {report.now:%Y-%m-%d %H:%M:%S} UTC minus {window:g} s, "
            f"database {using!r}: {report.total} group(s) of one principal and one "
            "request under several keys."
        )
        for endpoint, count in sorted(report.counts.items()):
            self.stdout.write(f"  {endpoint}: {count} group(s)")
        for group in report.groups[: options["limit"]]:
            where = f" (schema {group.schema})" if group.schema else ""
            self.stdout.write(
                f"{group.principal} {group.endpoint}{where}: {group.keys} keys, "
                f"{group.completed} completed, fingerprint {group.fingerprint[:12]}, "
                f"first {group.first:%Y-%m-%d %H:%M:%S} UTC, "
                f"last {group.last:%Y-%m-%d %H:%M:%S} UTC"
            )
        if report.total > len(report.groups[: options["limit"]]):
            self.stdout.write(f"Listed the {options['limit']} most recent; raise --limit for more.")
