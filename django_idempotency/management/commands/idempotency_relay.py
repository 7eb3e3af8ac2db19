"""``manage.py idempotency_relay``: deliver outbox messages without Celery."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils.translation import ngettext

from django_idempotency import relay
from django_idempotency.conf import conf
from django_idempotency.store.routing import all_databases


class Command(BaseCommand):
    """Run the outbox relay: once (``--once``) or in a loop (the default)."""

    help = (
        "Deliver due outbox messages. With --once, deliver everything due now and exit; "
        "otherwise poll every --interval seconds until stopped (or --max-iterations)."
    )

    def add_arguments(self, parser: CommandParser) -> None:  # noqa: D102
        parser.add_argument(
            "--once", action="store_true", help="Deliver what is due now, then exit."
        )
        parser.add_argument(
            "--interval",
            type=float,
            default=1.0,
            help="Seconds to wait after a pass that found nothing more to do (default 1).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="Messages claimed per batch (default: the OUTBOX_BATCH_SIZE setting).",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="Handlers run at the same time, in a thread pool (default: the "
            "OUTBOX_RELAY_THREADS setting, 1).",
        )
        parser.add_argument(
            "--max-iterations",
            type=int,
            default=None,
            help="Stop after this many batches (default: run until interrupted).",
        )
        parser.add_argument(
            "--database",
            default=None,
            choices=tuple(connections),
            help="Database alias (default: each alias of the IDEMPOTENCY DATABASES "
            "setting, else the router's choice).",
        )

    def handle(self, *args: Any, **options: Any) -> None:  # noqa: D102
        batch_size = options["batch_size"]
        if batch_size is None:
            batch_size = conf.outbox_batch_size
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        if options["interval"] < 0:
            raise CommandError("--interval must be 0 or more seconds.")
        threads = options["threads"]
        if threads is not None and threads < 1:
            raise CommandError("--threads must be at least 1.")
        limit = options["max_iterations"]
        if limit is not None and limit < 1:
            raise CommandError("--max-iterations must be at least 1.")
        aliases = (options["database"],) if options["database"] else all_databases()
        total = iterations = 0
        # One relay per database for the whole run: a batch's marks are written while
        # the next batch is claimed (docs/outbox.md, "Marks").
        relays = [relay.Relay(alias, threads=threads) for alias in aliases]
        try:
            while limit is None or iterations < limit:
                handled = [each.deliver_batch(batch_size) for each in relays]
                total += sum(handled)
                iterations += 1
                if all(count < batch_size for count in handled):  # drained for now
                    if options["once"]:
                        break
                    if limit is None or iterations < limit:
                        for each in relays:
                            each.close()  # nothing left pending while it sleeps
                        time.sleep(options["interval"])  # poll interval, not sync
        except KeyboardInterrupt:
            pass
        finally:
            for each in relays:
                each.close()
        self.stdout.write(
            ngettext(
                "Handled %(count)d outbox message.", "Handled %(count)d outbox messages.", total
            )
            % {"count": total}
        )
